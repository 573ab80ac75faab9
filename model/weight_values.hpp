#pragma once
// The values a weight tensor stands for, as f32: its bytes decoded by their type
// (quant::dequantize_row), times the row's scale, in the logical column order. The one
// definition of what a quantized checkpoint's weight means; backends that keep the weight
// quantized (the CPU matmul) apply the same row scales and column order their own way, and are
// tested against this.

#include <cstdint>
#include <string>

#include "model/weight_store.hpp"

namespace troupe {

// out[r * cols + c] = value(first_row + r, c) for r < num_rows, c < tensor.cols().
// `out` holds num_rows * tensor.cols() floats.
void weight_rows_f32(const weight_tensor& tensor, int64_t first_row, int64_t num_rows, float* out);

// Throws std::runtime_error naming the tensor when row_scales or input_order do not fit its
// shape (input_order must be a permutation of [0, cols)), or a row scale is NaN or infinite.
void check_weight_layout(const weight_tensor& tensor);

}  // namespace troupe
