#pragma once
// Writes the new tokens' K and V into the paged pools.
// Pool layout, per layer: [num_blocks, block_size, num_kv_heads, head_dim], so a slot
// (block * block_size + offset) holds all kv heads of one token contiguously.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

// One block per token. k, v [num_tokens, row_stride]; slot_mapping [num_tokens]
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

}  // namespace troupe::cuda
