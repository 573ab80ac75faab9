#pragma once
// Element-type plumbing shared by the kernels: load/store any activation type as f32, and the
// dispatch from the runtime dtype to a template argument.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "model/dtype.hpp"

namespace troupe::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

// Calls fn(T{}) with T the C++ type of an activation dtype.
template <typename Fn>
void dispatch_activation(dtype type, const char* op, Fn&& fn) {
  switch (type) {
    case dtype::f32: fn(float{}); return;
    case dtype::f16: fn(__half{}); return;
    case dtype::bf16: fn(__nv_bfloat16{}); return;
    default: break;
  }
  throw std::runtime_error(std::string("CUDA ") + op + ": activation dtype " + std::string(dtype_name(type)) +
                           " is not supported (expected f32, f16 or bf16)");
}

}  // namespace troupe::cuda
