#pragma once
// Rotary position embedding, HF rotate-half layout: for each head x of width D and i < D/2,
//   x[i]       <- x[i] cos(p f_i) - x[i + D/2] sin(p f_i)
//   x[i + D/2] <- x[i + D/2] cos(p f_i) + x[i] sin(p f_i)
// with f_i = inv_freq[i] (llama3 scaling folded in on the host). Qwen3's per-head q/k RMSNorm
// runs first, in the same pass, since it reads the very values RoPE rotates.

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"

namespace troupe::cuda {

// One block per token, one warp per head (q heads, then k heads).
// qkv [num_tokens, row_stride]; positions [num_tokens]; inv_freq [head_dim / 2]
template <typename T>
__global__ void rope_kernel(T* __restrict__ qkv, int64_t row_stride, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, const T* __restrict__ q_norm,
                            const T* __restrict__ k_norm, float eps, int num_heads, int num_kv_heads, int head_dim) {
  const int token = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, num_warps = blockDim.x / 32;
  const int half = head_dim / 2;
  const float position = static_cast<float>(positions[token]);
  T* row = qkv + token * row_stride;
  for (int head = warp; head < num_heads + num_kv_heads; head += num_warps) {
    T* x = row + static_cast<int64_t>(head) * head_dim;
    const T* norm = head < num_heads ? q_norm : k_norm;
    float inv_rms = 1.0f;
    if (norm) {
      float sum_squares = 0.0f;
      for (int d = lane; d < head_dim; d += 32) {
        float v = to_float(x[d]);
        sum_squares += v * v;
      }
      inv_rms = rsqrtf(warp_sum(sum_squares) / head_dim + eps);
    }
    for (int i = lane; i < half; i += 32) {
      float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
      if (norm) {
        x1 = to_float(from_float<T>(x1 * inv_rms)) * to_float(norm[i]);
        x2 = to_float(from_float<T>(x2 * inv_rms)) * to_float(norm[i + half]);
      }
      float sin_value, cos_value;
      sincosf(position * inv_freq[i], &sin_value, &cos_value);
      x[i] = from_float<T>(x1 * cos_value - x2 * sin_value);
      x[i + half] = from_float<T>(x2 * cos_value + x1 * sin_value);
    }
  }
}

}  // namespace troupe::cuda
