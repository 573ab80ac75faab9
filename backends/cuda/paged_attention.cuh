#pragma once
// Paged attention kernels (see paged_attention.hpp for the work decomposition).
//
// One CTA computes `rows_per_cta` query rows against one kv head over one split of the context,
// flash-attention style: K/V tiles of 32 tokens are gathered from their pages (in the pool's KV
// dtype, converted to f32 on the way: kv_types.cuh) into shared memory,
// scores and an online softmax (base 2, scale folded into q) update an f32 accumulator that also
// lives in shared memory, so head_dim and the row count stay run-time values without register
// arrays indexed at run time. Causality: a new token at index i of a sequence with q_len new
// tokens and context length ctx sits at position ctx - q_len + i and sees kv positions <= that.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"
#include "backends/cuda/kv_types.cuh"
#include "backends/cuda/paged_attention.hpp"

namespace troupe::cuda {

inline constexpr int attention_threads = 128;
inline constexpr int attention_tile = 32;  // kv tokens per tile: one per lane in the softmax

// Shared memory of the main kernel, in bytes.
inline size_t paged_attention_smem_bytes(int rows, int head_dim) {
  const size_t floats = 2 * static_cast<size_t>(rows) * head_dim + attention_tile * (head_dim + 1) +
                        attention_tile * head_dim + rows * (attention_tile + 1) + 3 * rows;
  return floats * sizeof(float) + 2 * rows * sizeof(int);
}

template <typename T, typename KV>
__global__ void __launch_bounds__(attention_threads) paged_attention_kernel(paged_attention_params p) {
  extern __shared__ float smem[];
  constexpr int tile = attention_tile;
  constexpr float log2e = 1.4426950408889634f;
  const int rows = p.rows_per_cta, head_dim = p.head_dim;
  float* q_s = smem;                                      // [rows, head_dim] q * scale * log2(e)
  float* o_s = q_s + rows * head_dim;                     // [rows, head_dim] unnormalized output
  float* k_s = o_s + rows * head_dim;                     // [tile, head_dim + 1] padded: lanes read columns
  float* v_s = k_s + tile * (head_dim + 1);               // [tile, head_dim]
  float* s_s = v_s + tile * head_dim;                     // [rows, tile + 1] scores, then probabilities
  float* max_s = s_s + rows * (tile + 1);                 // [rows] running max (base-2 logits)
  float* sum_s = max_s + rows;                            // [rows] running sum of probabilities
  float* alpha_s = sum_s + rows;                          // [rows] rescale of this tile
  int* q_row_s = reinterpret_cast<int*>(alpha_s + rows);  // [rows] batch row, -1 when unused
  int* limit_s = q_row_s + rows;                          // [rows] kv positions < limit are visible

  const int work = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int seq = p.work_items[2 * work], first_row = p.work_items[2 * work + 1];
  const int group = p.num_heads / p.num_kv_heads;
  const int q_begin = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - q_begin;
  const int context = p.context_lengths[seq];
  const int total_rows = q_len * group;
  const int tid = threadIdx.x;
  const int32_t* block_table = p.block_tables + p.block_table_start[seq];

  for (int r = tid; r < rows; r += blockDim.x) {
    const int row = first_row + r;
    const bool used = row < total_rows;
    q_row_s[r] = used ? q_begin + row / group : -1;
    limit_s[r] = used ? context - q_len + row / group + 1 : 0;
    max_s[r] = -INFINITY;
    sum_s[r] = 0.0f;
  }
  const T* q = static_cast<const T*>(p.q);
  const float q_scale = p.scale * log2e;
  for (int e = tid; e < rows * head_dim; e += blockDim.x) {
    const int r = e / head_dim, d = e % head_dim, row = first_row + r;
    float value = 0.0f;
    if (row < total_rows) {
      const int head = kv_head * group + row % group;
      value = to_float(q[(q_begin + row / group) * p.q_row_stride + head * head_dim + d]) * q_scale;
    }
    q_s[e] = value;
    o_s[e] = 0.0f;
  }

  // This CTA's kv range: its split's chunk (whole tiles), cut at what its last row may see.
  const int last_row = min(first_row + rows, total_rows) - 1;
  const int cta_limit = last_row >= 0 ? context - q_len + last_row / group + 1 : 0;
  const int per_split = (context + p.num_splits - 1) / p.num_splits;
  const int chunk = (per_split + tile - 1) / tile * tile;
  const int kv_begin = split * chunk;
  const int kv_end = min(min(context, kv_begin + chunk), cta_limit);
  __syncthreads();

  const char* k_cache = static_cast<const char*>(p.k_cache);
  const char* v_cache = static_cast<const char*>(p.v_cache);
  constexpr int vec = 8;  // elements per load: 8 of any KV type (16 bytes of f16, 8 of fp8, ...)
  const int vecs_per_token = head_dim / vec;
  const int warp = tid / 32, lane = tid % 32, num_warps = blockDim.x / 32;

  for (int tile_begin = kv_begin; tile_begin < kv_end; tile_begin += tile) {
    // Gather the tile's K and V from their pages; positions past the range become zeros so that
    // a zero probability never meets uninitialized memory.
    for (int i = tid; i < tile * vecs_per_token; i += blockDim.x) {
      const int c = i / vecs_per_token, part = i % vecs_per_token, t = tile_begin + c;
      float k_values[vec], v_values[vec];
      if (t < kv_end) {
        const int64_t slot = static_cast<int64_t>(block_table[t / p.block_size]) * p.block_size + t % p.block_size;
        const int64_t row = slot * p.kv_slot_bytes + static_cast<int64_t>(kv_head) * p.kv_head_bytes;
        kv_access<KV>::load8(k_cache + row, part * vec, k_values);
        kv_access<KV>::load8(v_cache + row, part * vec, v_values);
      } else {
#pragma unroll
        for (int j = 0; j < vec; ++j) k_values[j] = v_values[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < vec; ++j) {
        k_s[c * (head_dim + 1) + part * vec + j] = k_values[j];
        v_s[c * head_dim + part * vec + j] = v_values[j];
      }
    }
    __syncthreads();

    // Scores: a warp takes one row and the tile's 32 tokens, one per lane.
    for (int i = tid; i < rows * tile; i += blockDim.x) {
      const int r = i / tile, c = i % tile, t = tile_begin + c;
      float score = -INFINITY;
      if (t < kv_end && t < limit_s[r]) {
        const float* q_row = q_s + r * head_dim;
        const float* k_row = k_s + c * (head_dim + 1);
        float dot = 0.0f;
#pragma unroll 8
        for (int d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        score = dot;
      }
      s_s[r * (tile + 1) + c] = score;
    }
    __syncthreads();

    // Online softmax, a warp per row.
    for (int r = warp; r < rows; r += num_warps) {
      const float score = s_s[r * (tile + 1) + lane];
      const float old_max = max_s[r];
      const float new_max = fmaxf(old_max, warp_max(score));
      const float prob = new_max == -INFINITY ? 0.0f : exp2f(score - new_max);
      const float tile_sum = warp_sum(prob);
      s_s[r * (tile + 1) + lane] = prob;
      if (lane == 0) {
        const float alpha = new_max == -INFINITY ? 1.0f : exp2f(old_max - new_max);
        max_s[r] = new_max;
        sum_s[r] = sum_s[r] * alpha + tile_sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();

    // Accumulate P V: consecutive threads take consecutive columns of one row.
    for (int e = tid; e < rows * head_dim; e += blockDim.x) {
      const int r = e / head_dim, d = e % head_dim;
      const float* prob = s_s + r * (tile + 1);
      float acc = o_s[e] * alpha_s[r];
#pragma unroll 8
      for (int c = 0; c < tile; ++c) acc += prob[c] * v_s[c * head_dim + d];
      o_s[e] = acc;
    }
    __syncthreads();
  }

  if (p.num_splits == 1) {
    T* out = static_cast<T*>(p.out);
    for (int e = tid; e < rows * head_dim; e += blockDim.x) {
      const int r = e / head_dim, d = e % head_dim;
      if (q_row_s[r] < 0) continue;
      const int head = kv_head * group + (first_row + r) % group;
      const float sum = sum_s[r];
      out[(static_cast<int64_t>(q_row_s[r]) * p.num_heads + head) * head_dim + d] =
          from_float<T>(sum > 0.0f ? o_s[e] / sum : 0.0f);
    }
  } else {
    const int64_t base = ((static_cast<int64_t>(work) * p.num_kv_heads + kv_head) * p.num_splits + split) * rows;
    for (int e = tid; e < rows * head_dim; e += blockDim.x) p.partial_out[base * head_dim + e] = o_s[e];
    for (int r = tid; r < rows; r += blockDim.x) {
      p.partial_max[base + r] = max_s[r];
      p.partial_sum[base + r] = sum_s[r];
    }
  }
}

// Merges the splits of each (work item, kv head): a warp per row, lanes over head_dim.
template <typename T>
__global__ void __launch_bounds__(attention_threads) paged_attention_merge_kernel(paged_attention_params p) {
  const int work = blockIdx.x, kv_head = blockIdx.y;
  const int seq = p.work_items[2 * work], first_row = p.work_items[2 * work + 1];
  const int group = p.num_heads / p.num_kv_heads;
  const int q_begin = p.query_start[seq];
  const int total_rows = (p.query_start[seq + 1] - q_begin) * group;
  const int rows = p.rows_per_cta, head_dim = p.head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, num_warps = blockDim.x / 32;
  const int64_t base = (static_cast<int64_t>(work) * p.num_kv_heads + kv_head) * p.num_splits * rows;
  T* out = static_cast<T*>(p.out);
  for (int r = warp; r < rows; r += num_warps) {
    const int row = first_row + r;
    if (row >= total_rows) break;
    float global_max = -INFINITY;
    for (int s = 0; s < p.num_splits; ++s) global_max = fmaxf(global_max, p.partial_max[base + s * rows + r]);
    float total = 0.0f;
    for (int s = 0; s < p.num_splits; ++s) {
      const float m = p.partial_max[base + s * rows + r];
      if (m != -INFINITY) total += exp2f(m - global_max) * p.partial_sum[base + s * rows + r];
    }
    const int head = kv_head * group + row % group;
    T* out_row = out + (static_cast<int64_t>(q_begin + row / group) * p.num_heads + head) * head_dim;
    for (int d = lane; d < head_dim; d += 32) {
      float acc = 0.0f;
      for (int s = 0; s < p.num_splits; ++s) {
        const float m = p.partial_max[base + s * rows + r];
        if (m != -INFINITY) acc += exp2f(m - global_max) * p.partial_out[(base + s * rows + r) * head_dim + d];
      }
      out_row[d] = from_float<T>(total > 0.0f ? acc / total : 0.0f);
    }
  }
}

}  // namespace troupe::cuda
