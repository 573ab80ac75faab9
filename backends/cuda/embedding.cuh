#pragma once
// Row gather: the token embedding lookup, and the gather of the rows whose logits are wanted.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

// One block per output row. table [*, cols], ids [n], out [n, cols]
template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids, T* __restrict__ out,
                                 int cols) {
  const int64_t row = ids[blockIdx.x];
  const T* src = table + row * cols;
  T* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

}  // namespace troupe::cuda
