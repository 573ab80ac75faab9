#pragma once
// RMSNorm with the residual add fused in front (the add that ends each attention and MLP block).

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

// One block per row; the row's sum of squares is reduced through shared memory.
// x, residual, out [rows, cols]; weight [cols]; residual may be null.
template <typename T>
__global__ void rms_norm_kernel(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                T* __restrict__ out, int cols, float eps) {
  __shared__ float partial[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  float sum_squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float value = to_float(x[base + c]);
    if (residual) {
      value += to_float(residual[base + c]);
      residual[base + c] = from_float<T>(value);
      value = to_float(residual[base + c]);  // normalize exactly what the next block adds to
    }
    sum_squares += value * value;
  }
  sum_squares = warp_sum(sum_squares);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = sum_squares;
  __syncthreads();
  if (warp == 0) {
    float total = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
    total = warp_sum(total);
    if (lane == 0) partial[0] = rsqrtf(total / cols + eps);
  }
  __syncthreads();
  const float inv_rms = partial[0];
  const T* source = residual ? residual : x;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    out[base + c] = from_float<T>(to_float(source[base + c]) * inv_rms * to_float(weight[c]));
  }
}

}  // namespace troupe::cuda
