#pragma once
// Element type conversion (weight upload, and test plumbing) and GGUF Q8_0 dequantization.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

template <typename In, typename Out>
__global__ void convert_kernel(const In* __restrict__ in, Out* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<Out>(to_float(in[i]));
  }
}

// Q8_0 block: f16 scale d, then 32 int8 q; value = d * q. One thread per value.
template <typename Out>
__global__ void dequantize_q8_0_kernel(const uint8_t* __restrict__ blocks, Out* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* block = blocks + (i / 32) * 34;
    __half_raw raw;
    raw.x = static_cast<unsigned short>(block[0] | (block[1] << 8));
    float scale = __half2float(__half(raw));
    int8_t q = static_cast<int8_t>(block[2 + i % 32]);
    out[i] = from_float<Out>(scale * static_cast<float>(q));
  }
}

}  // namespace troupe::cuda
