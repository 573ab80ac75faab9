#pragma once
// Attention of a flattened varlen batch over the paged KV pool (kv_pool.hpp's layout), in the
// pool's dtype.
//
// Sequence s owns batch rows query_start[s] .. query_start[s+1]: its newest tokens, the last
// num_new of its context_lengths[s] tokens (whose K/V must already be in the pool). Query i of
// those attends causally to context tokens 0 .. context_length - num_new + i (with a window, only
// the last `window` of them), read through the sequence's block table; a block that holds none
// of a sliding layer's visible keys is never read. Query head h reads KV head h / (num_heads / num_kv_heads) (GQA).
//
// The step is cut into pieces (paged_attention_kernels.hpp): per sequence and KV head, its new
// tokens in tiles (all query heads of the group together, so each K/V byte is read once per
// tile, not once per head), and when the pieces are too few to keep every thread busy (a few
// long decodes), each piece's keys split at partition boundaries, computed on different threads
// and folded back in key order (flash-decoding). However a step is cut, a query's output has the
// same bits (paged_attention_kernels.hpp, "Bit invariance"). Prefill tiles are ordered longest
// first so that the causal triangle's uneven pieces balance across threads.

#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "model/dtype.hpp"
#include "model/forward_batch.hpp"

namespace troupe::cpu {

// What every kernel needs to know besides the batch: a plain struct, so that attention variants
// (windows, sinks, soft-capping) add fields here.
struct attention_params {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int64_t num_blocks = 0;      // blocks in the pool, to check block tables against
  float scale = 0.0f;          // usually 1 / sqrt(head_dim)
  dtype kv_type = dtype::f32;  // the pool's element type (a KV element: model/kv_transfer.hpp)
  // Variants of the softmax, all off by default:
  // - window > 0 (a sliding layer): the query at position p sees keys at positions > p - window,
  //   its own included (llama.cpp's and HF's convention: `window` keys at most);
  // - softcap > 0 (Gemma 2): each score s = q·k·scale becomes softcap · tanh(s / softcap)
  //   before the softmax;
  // - sinks (gpt-oss): [num_heads] one learned logit per head that joins every softmax's
  //   denominator (exp(sink) added to the sum) without a value: the weights sum to less than 1.
  int window = 0;
  float softcap = 0.0f;
  const float* sinks = nullptr;
};

// Reused between calls so that a steady-state step does not allocate.
struct attention_workspace {
  struct piece_plan {
    int32_t seq;
    int32_t kv_head;
    int32_t first_query;  // index among the sequence's new tokens
    int32_t num_queries;
    int32_t key_begin;
    int32_t key_end;
    int32_t partial;  // index of its partial result when split, -1 when it writes the output
  };
  struct merge_plan {
    int32_t seq;
    int32_t kv_head;
    int32_t first_query;
    int32_t num_queries;
    int32_t first_partial;  // its splits are partials first_partial .. + num_splits
    int32_t num_splits;
  };
  std::vector<piece_plan> pieces;
  std::vector<merge_plan> merges;
  std::vector<float> partials;    // [num_partials, partial_floats]: acc [rows, head_dim], max [rows], sum [rows]
  std::vector<float> per_thread;  // [num_threads, kernel scratch]
};

// Checks the batch's sequence bookkeeping (query_start, context_lengths, block tables) against
// the pool; throws std::runtime_error naming the first inconsistency.
void check_attention_batch(const forward_batch& batch, const attention_params& params);

// q: [num_tokens, num_heads, head_dim] rows ldq floats apart; out: same shape, rows ldo apart.
// key_pool / value_pool: one layer's [num_blocks, block_size, num_kv_heads, head_dim] of
// params.kv_type.
void paged_attention(thread_pool& pool, const float* q, int64_t ldq, const std::byte* key_pool,
                     const std::byte* value_pool, const forward_batch& batch, const attention_params& params,
                     float* out, int64_t ldo, attention_workspace& workspace);

}  // namespace troupe::cpu
