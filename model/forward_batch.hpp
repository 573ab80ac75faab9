#pragma once
// One step's work for a model, flattened: the new tokens of every scheduled sequence laid end to
// end with no padding. Prefill chunks and single decode tokens mix freely.
//
// Paged KV cache: token t of a sequence lives in slot block_table[t / block_size] * block_size
// + t % block_size of every layer's K and V pools.

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe {

struct forward_batch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] position of each token in its sequence
  std::vector<int64_t> slot_mapping;  // [num_tokens] KV slot each new token's K/V is written to

  // Per sequence i: its new tokens are rows query_start[i] .. query_start[i+1] of the batch,
  // and it attends to context_lengths[i] tokens in all (already cached + new).
  std::vector<int32_t> query_start;        // [num_seqs + 1]
  std::vector<int32_t> context_lengths;    // [num_seqs]
  std::vector<int32_t> block_table_start;  // [num_seqs + 1] offsets into block_tables
  std::vector<int32_t> block_tables;       // concatenated block ids of every sequence

  // Rows of the batch whose logits are wanted (usually each sequence's last new token when its
  // prompt is complete). Logits come back in this order.
  std::vector<int32_t> logits_rows;  // [num_logits]
  // Rows whose final hidden state (after the last norm: what the logits are computed from) is
  // wanted, for embeddings, and where they go: hidden_out [hidden_rows.size(), hidden_size], in
  // this order. A backend that cannot give them throws.
  std::vector<int32_t> hidden_rows;  // [num_hidden]
  float* hidden_out = nullptr;

  // Pipeline stages (model/layer_range.hpp). A stage after the first reads the residual stream
  // the previous stage left instead of embedding token_ids (which it still gets: they size the
  // batch): residual_in [num_tokens, hidden_size]. A stage before the last writes the residual
  // stream as its last layer leaves it to residual_out [num_tokens, hidden_size] and computes no
  // logits or hidden rows (logits_rows and hidden_rows must then be empty). Both must stay valid
  // until forward returns.
  const float* residual_in = nullptr;
  float* residual_out = nullptr;

  // When set, called on the forward's thread as soon as layer L's K/V of this batch are in the
  // pool, before the later layers compute: a prefill instance exports each layer's KV from here
  // so the transfer overlaps the rest of the forward (engine/kv_layer_sink.hpp). A backend that
  // cannot call it between layers calls it for every layer, in order, once the forward is done.
  std::function<void(int layer)> after_layer_kv;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(context_lengths.size()); }
  int num_logits() const { return static_cast<int>(logits_rows.size()); }
};

}  // namespace troupe
