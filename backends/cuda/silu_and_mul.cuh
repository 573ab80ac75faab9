#pragma once
// SwiGLU's activation: silu(gate) * up, reading the fused gate_up projection's output.

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

// gate_up [rows, 2 * inter], out [rows, inter]; grid-stride over rows * inter.
template <typename T>
__global__ void silu_and_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int inter) {
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / inter, col = i % inter;
    const float gate = to_float(gate_up[row * 2 * inter + col]);
    const float up = to_float(gate_up[row * 2 * inter + inter + col]);
    out[i] = from_float<T>(gate / (1.0f + __expf(-gate)) * up);
  }
}

}  // namespace troupe::cuda
