#pragma once
// Conversions of whole rows between f32 and the weight formats, and Q8_0 quantization.
// Loaders and the model maker use these off the hot path; backends have their own SIMD kernels.

#include <cstdint>
#include <span>

#include "model/dtype.hpp"
#include "model/half_float.hpp"

namespace troupe {

// Q8_0: per block of 32 values, d = max|x| / 127 stored as f16, then 32 int8 round(x / d).
// `values.size()` must be a multiple of 32; `out` gets values.size() / 32 * 34 bytes.
void quantize_q8_0(std::span<const float> values, std::byte* out);

// Converts `values` to `type`, writing row_bytes(type, values.size()) bytes.
void convert_from_f32(std::span<const float> values, dtype type, std::byte* out);
// Reads `out.size()` values of `type` into f32 (any type: quant::dequantize_row).
void convert_to_f32(const std::byte* data, dtype type, std::span<float> out);

}  // namespace troupe
