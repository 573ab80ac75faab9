#pragma once
// Every weight type from f32, the writers' one entry point (dequantize.hpp is the readers'):
// the model quantizer, the model maker and the loaders' conversions call it; each family's
// quantizer is in its own file beside its dequantizer.

#include <cstddef>
#include <cstdint>

#include "model/dtype.hpp"

namespace troupe::quant {

// Writes row_bytes(type, count) bytes of `type` for the `count` values at x (whole blocks of the
// type). `weights` (nullptr: all equal) holds one non-negative weight per value: how much that
// value's squared error costs, in practice the importance of its column (an imatrix entry).
// Plain types (f32, f16, bf16, fp8_e4m3) convert each value and ignore the weights.
void quantize_row(dtype type, const float* x, int64_t count, std::byte* out, const float* weights = nullptr);

}  // namespace troupe::quant
