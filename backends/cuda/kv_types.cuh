#pragma once
// The KV pool's element types on the GPU (model/kv_transfer.hpp): f32, f16, bf16 stored as
// themselves, fp8_e4m3 (one byte, saturating at +-448) and q8_0 (GGUF blocks of 32 along a head:
// an f16 scale, 32 int8). kv_access<KV> reads 8 elements of a head's row as f32 and writes a
// row from activations, with the same rounding as the CPU's encoders (nearest even), so a pool
// written on either device holds the same bytes.

#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_types.cuh"
#include "model/dtype.hpp"

namespace troupe::cuda {

struct kv_q8_0 {};  // storage tags for the quantized KV types
struct kv_fp8 {};

// Plain types: the element itself. `row` is a head's row; e a multiple of 8.
template <typename KV>
struct kv_access {
  static __device__ __forceinline__ void load8(const char* row, int e, float out[8]) {
    const KV* elements = reinterpret_cast<const KV*>(row) + e;
    if constexpr (sizeof(KV) == 4) {
      const float4 a = *reinterpret_cast<const float4*>(elements);
      const float4 b = *reinterpret_cast<const float4*>(elements + 4);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
      const uint4 raw = *reinterpret_cast<const uint4*>(elements);
      const KV* values = reinterpret_cast<const KV*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = to_float(values[j]);
    }
  }
  // Units a row is written in: one element.
  static constexpr int unit = 1;
  template <typename T>
  static __device__ __forceinline__ void store_unit(const T* in, char* row, int u) {
    reinterpret_cast<KV*>(row)[u] = from_float<KV>(to_float(in[u]));
  }
};

template <>
struct kv_access<kv_fp8> {
  static __device__ __forceinline__ void load8(const char* row, int e, float out[8]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(row + e);
    const __nv_fp8_e4m3* values = reinterpret_cast<const __nv_fp8_e4m3*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = static_cast<float>(values[j]);
  }
  static constexpr int unit = 1;
  template <typename T>
  static __device__ __forceinline__ void store_unit(const T* in, char* row, int u) {
    reinterpret_cast<__nv_fp8_storage_t*>(row)[u] = __nv_cvt_float_to_fp8(to_float(in[u]), __NV_SATFINITE, __NV_E4M3);
  }
};

template <>
struct kv_access<kv_q8_0> {
  static __device__ __forceinline__ void load8(const char* row, int e, float out[8]) {
    const char* block = row + (e / 32) * 34;
    const float scale = __half2float(*reinterpret_cast<const __half*>(block));
    const int8_t* quants = reinterpret_cast<const int8_t*>(block + 2 + e % 32);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = scale * static_cast<float>(quants[j]);
  }
  // One block of 32 a unit: d = max|x| / 127, q = x / d to nearest even, d stored as f16.
  static constexpr int unit = 32;
  template <typename T>
  static __device__ __forceinline__ void store_unit(const T* in, char* row, int u) {
    const T* x = in + u * 32;
    float amax = 0.0f;
#pragma unroll 8
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(to_float(x[i])));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    char* block = row + u * 34;
    *reinterpret_cast<__half*>(block) = __float2half_rn(d);
    int8_t* quants = reinterpret_cast<int8_t*>(block + 2);
#pragma unroll 8
    for (int i = 0; i < 32; ++i) quants[i] = static_cast<int8_t>(__float2int_rn(to_float(x[i]) * inverse));
  }
};

// Calls fn(KV{}) with KV the storage type of a KV dtype.
template <typename Fn>
void dispatch_kv(dtype type, const char* op, Fn&& fn) {
  switch (type) {
    case dtype::f32: fn(float{}); return;
    case dtype::f16: fn(__half{}); return;
    case dtype::bf16: fn(__nv_bfloat16{}); return;
    case dtype::q8_0: fn(kv_q8_0{}); return;
    case dtype::fp8_e4m3: fn(kv_fp8{}); return;
    default: break;
  }
  throw std::runtime_error(std::string("CUDA ") + op + ": KV dtype " + std::string(dtype_name(type)) +
                           " is not supported (expected f32, f16, bf16, q8_0 or fp8_e4m3)");
}

}  // namespace troupe::cuda
