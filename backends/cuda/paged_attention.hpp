#pragma once
// Paged attention over the KV pools, for any mix of prefill chunks and decode tokens.
//
// Work is planned on the host once per step (plan_paged_attention) and run from fixed device
// buffers (paged_attention), so a decode step can be captured in a CUDA graph and replayed.
//
// Grid: one CTA per (work item, kv head, split). A work item is `rows_per_cta` consecutive query
// rows of one sequence, where rows enumerate (new token, query head of the kv head's group):
// row r is token r / group, head kv_head * group + r % group. Grouping the query heads that share
// a kv head makes each K/V tile load serve all of them (GQA). Splits cut the context into
// chunks processed by different CTAs (flash-decoding) and merged afterwards, which is what keeps
// the GPU busy when a decode batch is small.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "model/dtype.hpp"

namespace troupe::cuda {

struct paged_attention_params {
  const void* q = nullptr;  // [num_tokens, q_row_stride], head h at h * head_dim
  int64_t q_row_stride = 0;
  const void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of the KV dtype
  const void* v_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of the KV dtype
  int64_t kv_slot_bytes = 0;      // one token's row of every kv head: row_bytes(kv dtype, num_kv_heads * head_dim)
  int64_t kv_head_bytes = 0;      // one kv head's row: row_bytes(kv dtype, head_dim)
  void* out = nullptr;            // [num_tokens, num_heads * head_dim]

  const int32_t* query_start = nullptr;        // [num_seqs + 1]
  const int32_t* context_lengths = nullptr;    // [num_seqs] cached + new tokens
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1]
  const int32_t* block_tables = nullptr;       // concatenated block ids
  const int32_t* work_items = nullptr;         // [num_work, 2] (sequence, first row)

  float* partial_out = nullptr;  // [num_work, num_kv_heads, num_splits, rows_per_cta, head_dim] when split
  float* partial_max = nullptr;  // [num_work, num_kv_heads, num_splits, rows_per_cta]
  float* partial_sum = nullptr;  // [num_work, num_kv_heads, num_splits, rows_per_cta]

  int num_work = 0;
  int num_splits = 1;
  int rows_per_cta = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  float scale = 0.0f;  // softmax scale, usually 1 / sqrt(head_dim)
};

// The host side of a step's attention: which CTAs exist. Depends only on the query lengths and
// the GPU's size, never on context lengths except through `max_context`, so a decode plan for a
// given batch size is the same every step (what CUDA graphs need).
struct paged_attention_plan {
  std::vector<int32_t> work_items;  // [num_work, 2]
  int rows_per_cta = 0;
  int num_splits = 1;
  int num_work() const { return static_cast<int>(work_items.size() / 2); }
};

// query_start [num_seqs + 1]. `max_context` <= 0 means unknown (graph capture): splits are then
// chosen for the worst case and empty ones exit early.
paged_attention_plan plan_paged_attention(const std::vector<int32_t>& query_start, int num_heads, int num_kv_heads,
                                          int head_dim, int max_context, int num_sms);

// Floats of workspace (partial_out + partial_max + partial_sum) a plan needs.
size_t paged_attention_workspace_floats(const paged_attention_plan& plan, int num_kv_heads, int head_dim);

// `type`: q and out (the activation dtype); `kv_type`: the pools' (f32, f16, bf16, q8_0, fp8_e4m3).
void paged_attention(const paged_attention_params& params, dtype type, dtype kv_type, cudaStream_t stream);

}  // namespace troupe::cuda
