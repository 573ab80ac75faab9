#pragma once
// Conversions of whole rows between f32 and the weight formats (any type: quantized types go
// through the quantizers of model/quant/). Loaders and the model maker use these off the hot
// path; backends have their own SIMD kernels.

#include <cstdint>
#include <span>

#include "model/dtype.hpp"
#include "model/half_float.hpp"

namespace troupe {

// Converts `values` to `type`, writing row_bytes(type, values.size()) bytes; a quantized type
// needs a whole number of its blocks (throws naming the type otherwise).
void convert_from_f32(std::span<const float> values, dtype type, std::byte* out);
// Reads `out.size()` values of `type` into f32 (any type: quant::dequantize_row).
void convert_to_f32(const std::byte* data, dtype type, std::span<float> out);

}  // namespace troupe
