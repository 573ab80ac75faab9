#pragma once
// FP8 E4M3FN (the OCP "fn" variant FP8 checkpoints and KV caches use): 1 sign bit, 4 exponent
// bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN, the largest finite value is
// 448, the smallest subnormal 2^-9.
//
// Two weight types hold it:
//   fp8_e4m3       one byte per element; a checkpoint's per-tensor or per-channel scale is not in
//                  the bytes but in weight_tensor::row_scales (model/weight_values.hpp applies it)
//   fp8_e4m3_b128  blocks of 128: [scale f32][128 x e4m3], x[j] = scale * e4m3(q[j]): the
//                  block-wise scales of DeepSeek-V3 / Qwen3 FP8 checkpoints (weight_block_size),
//                  each 128 columns of a row carrying the scale of their [rows, cols] block

#include <cstddef>
#include <cstdint>

namespace troupe::quant {

inline constexpr float fp8_e4m3_max = 448.0f;

float fp8_e4m3_to_f32(uint8_t bits);
// Rounds to nearest even; values beyond ±448 saturate to ±448 (as the checkpoint tools and
// KV-cache writers do, not to NaN); NaN stays NaN.
uint8_t f32_to_fp8_e4m3(float value);

void dequantize_fp8_e4m3(const std::byte* data, float* out, int64_t count);

inline constexpr int64_t fp8_b128_block_size = 128;
inline constexpr size_t fp8_b128_block_bytes = 4 + 128;
// `count` (a multiple of 128) values from count / 128 fp8_e4m3_b128 blocks.
void dequantize_fp8_e4m3_b128(const std::byte* blocks, float* out, int64_t count);

}  // namespace troupe::quant
