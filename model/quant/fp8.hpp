#pragma once
// FP8 E4M3FN (the OCP "fn" variant FP8 checkpoints and KV caches use): 1 sign bit, 4 exponent
// bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN, the largest finite value is
// 448, the smallest subnormal 2^-9.

#include <cstddef>
#include <cstdint>

namespace troupe::quant {

inline constexpr float fp8_e4m3_max = 448.0f;

float fp8_e4m3_to_f32(uint8_t bits);
// Rounds to nearest even; values beyond ±448 saturate to ±448 (as the checkpoint tools and
// KV-cache writers do, not to NaN); NaN stays NaN.
uint8_t f32_to_fp8_e4m3(float value);

void dequantize_fp8_e4m3(const std::byte* data, float* out, int64_t count);

}  // namespace troupe::quant
