#pragma once
// Host stand-ins for the device-only CUDA intrinsics that the quantized kernels' device branches
// call, as the CUDA Math API documents them, so a host test can compile those branches
// (TROUPE_EMULATE_DEVICE, see backends/cuda/quant_blocks.cuh). The half and bfloat16
// conversions they also use are host-callable in cuda_fp16.h / cuda_bf16.h already.
// Include this first, in a test file of its own, with TROUPE_EMULATE_DEVICE defined.

#if !defined(TROUPE_EMULATE_DEVICE)
#error "define TROUPE_EMULATE_DEVICE before including device_intrinsics.hpp"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>

// Result byte n is byte ((s >> 4n) & 7) of the eight bytes x (0-3) then y (4-7).
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t both = static_cast<uint64_t>(x) | (static_cast<uint64_t>(y) << 32);
  unsigned int result = 0;
  for (int n = 0; n < 4; ++n)
    result |= static_cast<unsigned int>((both >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
  return result;
}

static inline float __uint_as_float(unsigned int bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// Round-to-nearest-even operations, never contracted (x86-64 SSE arithmetic rounds each one).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
