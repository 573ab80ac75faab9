#pragma once
// Every weight type to f32, the one reference: loaders, the model maker, the quantizer and tests
// use it off the hot path; the backends' SIMD kernels are checked against it.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "model/dtype.hpp"

namespace troupe::quant {

// out[0 .. count) = the `count` elements of `type` at `data` (count: whole blocks of the type).
void dequantize_row(dtype type, const std::byte* data, float* out, int64_t count);

// The first block among the `count` elements at `data` whose scale (or min) is NaN or infinite,
// if any: such a block turns every product it enters into NaN. Plain types have no scales.
std::optional<int64_t> first_bad_scale_block(dtype type, const std::byte* data, int64_t count);

}  // namespace troupe::quant
