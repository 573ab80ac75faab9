#pragma once
// The KV round trip of issue 11 on stories260K, for any two models: prefill a prompt on the
// exporter, move its blocks into the importer at other block ids, and run the next decode step
// on both.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/kv_transfer.hpp"
#include "model/model.hpp"
#include "tests/backends/cpu_greedy_support.hpp"

namespace troupe::test {

// 11 tokens: with blocks of 4, three blocks, the last one partly filled.
inline const std::vector<int32_t> kv_transfer_prompt = {1, 403, 407, 261, 378, 432, 383, 322, 353, 323, 365};

// Prefill of `prompt` on `m` in `blocks`; returns the greedy next token.
inline int32_t prefill(model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& blocks) {
  std::vector<float> logits(m.config().vocab_size);
  const int total = static_cast<int>(prompt.size());
  m.forward(one_sequence_batch(prompt, 0, total, blocks, m.kv_shape().block_size), logits.data());
  return argmax(logits.data(), m.config().vocab_size);
}

// The logits of the decode step that feeds `next` after `prompt`, whose KV is in `blocks`.
inline std::vector<float> decode_logits(model& m, std::vector<int32_t> prompt, int32_t next,
                                        const std::vector<int32_t>& blocks) {
  std::vector<float> logits(m.config().vocab_size);
  const int computed = static_cast<int>(prompt.size());
  prompt.push_back(next);
  m.forward(one_sequence_batch(prompt, computed, computed + 1, blocks, m.kv_shape().block_size), logits.data());
  return logits;
}

// Exports layers [first, first + count) of `from`'s `from_blocks` as `element` and imports them
// into `to`'s `to_blocks`.
inline void move_kv(const model& from, const std::vector<int32_t>& from_blocks, model& to,
                    const std::vector<int32_t>& to_blocks, int first_layer, int num_layers, dtype element) {
  const kv_span_header header = kv_span_for(from.config(), from.kv_shape(), static_cast<int>(from_blocks.size()),
                                            first_layer, num_layers, element);
  std::vector<std::byte> span(kv_span_bytes(header));  // [num_layers, 2, blocks, block_size, kv_heads, head_dim]
  from.export_kv(from_blocks, first_layer, num_layers, element, span);
  to.import_kv(to_blocks, header, span);
}

inline float max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? worst : INFINITY;
}

}  // namespace troupe::test
