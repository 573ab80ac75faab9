#pragma once
// Greedy decoding of one sequence through troupe::model, the way a scheduler would drive it:
// the whole prompt in one forward, then one token per forward, K/V in the blocks given.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/forward_batch.hpp"
#include "model/model.hpp"

namespace troupe::test {

inline int argmax(const float* values, int count) {
  return static_cast<int>(std::max_element(values, values + count) - values);
}

// One sequence's forward: tokens [computed, total) on top of the K/V already in `blocks`, with
// the logits of the last one.
inline forward_batch one_sequence_batch(const std::vector<int32_t>& tokens, int computed, int total,
                                        const std::vector<int32_t>& blocks, int block_size) {
  forward_batch batch;
  for (int t = computed; t < total; ++t) {
    batch.token_ids.push_back(tokens[t]);
    batch.positions.push_back(t);
    batch.slot_mapping.push_back(int64_t{blocks[t / block_size]} * block_size + t % block_size);
  }
  batch.query_start = {0, total - computed};
  batch.context_lengths = {total};
  batch.block_table_start = {0, static_cast<int32_t>(blocks.size())};
  batch.block_tables = blocks;
  batch.logits_rows = {total - computed - 1};
  return batch;
}

struct greedy_result {
  std::vector<int32_t> generated;
  std::vector<float> first_logits;  // [vocab] logits after the prompt
  std::vector<float> margins;       // per step: top-1 minus top-2 logit
};

// Blocks 0, 1, 2, ... unless `blocks` names others.
inline greedy_result greedy_generate(model& m, const std::vector<int32_t>& prompt, int steps,
                                     std::vector<int32_t> blocks = {}) {
  const int block_size = m.kv_shape().block_size;
  const int vocab = m.config().vocab_size;
  const int needed = (static_cast<int>(prompt.size()) + steps + block_size - 1) / block_size;
  for (int b = static_cast<int>(blocks.size()); b < needed; ++b) blocks.push_back(b);
  std::vector<int32_t> tokens = prompt;
  greedy_result result;
  std::vector<float> logits(vocab);
  int computed = 0;
  while (static_cast<int>(result.generated.size()) < steps) {
    const int total = static_cast<int>(tokens.size());
    const forward_batch batch = one_sequence_batch(tokens, computed, total, blocks, block_size);
    m.forward(batch, logits.data());
    if (result.first_logits.empty()) result.first_logits = logits;
    computed = total;
    const int next = argmax(logits.data(), vocab);
    float second = -INFINITY;
    for (int i = 0; i < vocab; ++i)
      if (i != next) second = std::max(second, logits[i]);
    result.margins.push_back(logits[next] - second);
    result.generated.push_back(next);
    tokens.push_back(next);
  }
  return result;
}

// Teacher forcing: the logits after `prompt` and after each of `forced` but the last, one decode
// forward per step on the same KV blocks (0, 1, 2, ...), whatever the model itself would pick.
// [forced.size()][vocab]
inline std::vector<std::vector<float>> teacher_forced_logits(model& m, const std::vector<int32_t>& prompt,
                                                             const std::vector<int32_t>& forced) {
  const int block_size = m.kv_shape().block_size;
  const int vocab = m.config().vocab_size;
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), forced.begin(), forced.end());
  std::vector<int32_t> blocks;
  for (int b = 0; b * block_size < static_cast<int>(tokens.size()); ++b) blocks.push_back(b);
  std::vector<std::vector<float>> steps;
  int computed = 0;
  for (size_t step = 0; step < forced.size(); ++step) {
    const int total = static_cast<int>(prompt.size() + step);
    const forward_batch batch = one_sequence_batch(tokens, computed, total, blocks, block_size);
    steps.emplace_back(vocab);
    m.forward(batch, steps.back().data());
    computed = total;
  }
  return steps;
}

}  // namespace troupe::test
