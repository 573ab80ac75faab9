#pragma once
// Scalar conversions between f32 and the 16-bit weight formats, and Q8_0 (de)quantization.
// Loaders and the model maker use these off the hot path; backends have their own SIMD kernels.

#include <cstdint>
#include <cstring>
#include <span>

#include "kernels/dtype.hpp"

namespace troupe {

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, overflow to infinity, subnormals kept.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal f16: subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exponent;  // subnormal f16 counts units of 2^-24
    uint32_t value = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (value & 1))) ++value;
    return static_cast<uint16_t>(sign | value);
  }
  uint32_t value = ((abs >> 13) - ((127 - 15) << 10));
  uint32_t remainder = abs & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (value & 1))) ++value;
  return static_cast<uint16_t>(sign | value);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Q8_0: per block of 32 values, d = max|x| / 127 stored as f16, then 32 int8 round(x / d).
// `values.size()` must be a multiple of 32; `out` gets values.size() / 32 * 34 bytes.
void quantize_q8_0(std::span<const float> values, std::byte* out);
void dequantize_q8_0(const std::byte* blocks, std::span<float> out);

// Converts `values` to `type`, writing row_bytes(type, values.size()) bytes.
void convert_from_f32(std::span<const float> values, dtype type, std::byte* out);
// Reads `out.size()` values of `type` into f32.
void convert_to_f32(const std::byte* data, dtype type, std::span<float> out);

}  // namespace troupe
