#pragma once
// Writes the new tokens' K and V into the paged pools.
// Pool layout, per layer: [num_blocks, block_size, num_kv_heads, head_dim] of the KV dtype, so a
// slot (block * block_size + offset) holds all kv heads of one token contiguously.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"
#include "backends/cuda/kv_types.cuh"

namespace troupe::cuda {

// One block per token, the pool in the activation type. k, v [num_tokens, row_stride];
// slot_mapping [num_tokens]
template <typename T>
__global__ void kv_cache_store_kernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                                      const int64_t* __restrict__ slot_mapping, T* __restrict__ k_cache,
                                      T* __restrict__ v_cache, int width) {
  const int64_t slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const int64_t source = blockIdx.x * row_stride;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[slot * width + i] = k[source + i];
    v_cache[slot * width + i] = v[source + i];
  }
}

// One block per token, the pool in another KV type: each thread writes whole units of a slot
// (an element, or a q8_0 block of 32). slot_bytes: one token's K (or V) row in the pool.
template <typename T, typename KV>
__global__ void kv_cache_store_converting_kernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                                                 const int64_t* __restrict__ slot_mapping, char* __restrict__ k_cache,
                                                 char* __restrict__ v_cache, int width, int64_t slot_bytes) {
  const int64_t slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const int64_t source = blockIdx.x * row_stride;
  for (int u = threadIdx.x; u < width / kv_access<KV>::unit; u += blockDim.x) {
    kv_access<KV>::store_unit(k + source, k_cache + slot * slot_bytes, u);
    kv_access<KV>::store_unit(v + source, v_cache + slot * slot_bytes, u);
  }
}

}  // namespace troupe::cuda
