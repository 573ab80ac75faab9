#pragma once
// Attention of a flattened varlen batch over the paged KV pool (kv_pool.hpp's layout).
//
// Sequence s owns batch rows query_start[s] .. query_start[s+1]: its newest tokens, the last
// num_new of its context_lengths[s] tokens (whose K/V must already be in the pool). Query i of
// those attends causally to context tokens 0 .. context_length - num_new + i, read through the
// sequence's block table. Query head h reads KV head h / (num_heads / num_kv_heads) (GQA).
// Softmax is computed online (running max and sum) block by block, so no score matrix of the
// whole context is ever formed. Work is split over (sequence, head, tile of 16 queries).

#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "model/forward_batch.hpp"

namespace troupe::cpu {

struct attention_shape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int64_t num_blocks = 0;  // blocks in the pool, to check block tables against
  float scale = 0.0f;      // usually 1 / sqrt(head_dim)
};

// Reused between calls so that a steady-state step does not allocate.
struct attention_workspace {
  struct work_item {
    int32_t seq;
    int32_t head;
    int32_t first_query;  // index among the sequence's new tokens
    int32_t num_queries;
  };
  std::vector<work_item> items;
  std::vector<float> per_thread;  // [num_threads, tile scratch]
};

// Checks the batch's sequence bookkeeping (query_start, context_lengths, block tables) against
// the pool; throws std::runtime_error naming the first inconsistency.
void check_attention_batch(const forward_batch& batch, const attention_shape& shape);

// q: [num_tokens, num_heads, head_dim] rows ldq floats apart; out: same shape, rows ldo apart.
// key_pool / value_pool: one layer's [num_blocks, block_size, num_kv_heads, head_dim].
void paged_attention(thread_pool& pool, const float* q, int64_t ldq, const float* key_pool,
                     const float* value_pool, const forward_batch& batch,
                     const attention_shape& shape, float* out, int64_t ldo,
                     attention_workspace& workspace);

}  // namespace troupe::cpu
