#include "model/weight_values.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "model/quant/dequantize.hpp"

namespace troupe {

void weight_rows_f32(const weight_tensor& tensor, int64_t first_row, int64_t num_rows, float* out) {
  const int64_t cols = tensor.cols();
  const size_t stride = row_bytes(tensor.type, cols);
  std::vector<float> stored(tensor.input_order.empty() ? 0 : static_cast<size_t>(cols));  // [cols]
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row = first_row + r;
    float* values = out + r * cols;
    float* decoded = tensor.input_order.empty() ? values : stored.data();
    quant::dequantize_row(tensor.type, tensor.data + row * stride, decoded, cols);
    if (!tensor.input_order.empty()) {
      for (int64_t j = 0; j < cols; ++j) values[tensor.input_order[j]] = decoded[j];
    }
    if (!tensor.row_scales.empty()) {
      const float scale = tensor.row_scales[row];
      for (int64_t c = 0; c < cols; ++c) values[c] *= scale;
    }
  }
}

void check_weight_layout(const weight_tensor& tensor) {
  if (!tensor.row_scales.empty()) {
    if (static_cast<int64_t>(tensor.row_scales.size()) != tensor.rows()) {
      throw std::runtime_error("tensor '" + tensor.name + "' has " + std::to_string(tensor.row_scales.size()) +
                               " row scales for " + std::to_string(tensor.rows()) + " rows");
    }
    for (size_t r = 0; r < tensor.row_scales.size(); ++r) {
      if (!std::isfinite(tensor.row_scales[r])) {
        throw std::runtime_error("tensor '" + tensor.name + "' has a NaN or infinite scale for row " +
                                 std::to_string(r));
      }
    }
  }
  if (!tensor.input_order.empty()) {
    const int64_t cols = tensor.cols();
    if (static_cast<int64_t>(tensor.input_order.size()) != cols) {
      throw std::runtime_error("tensor '" + tensor.name + "' has a column order of " +
                               std::to_string(tensor.input_order.size()) + " entries for " + std::to_string(cols) +
                               " columns");
    }
    std::vector<bool> seen(static_cast<size_t>(cols), false);
    for (int32_t c : tensor.input_order) {
      if (c < 0 || c >= cols || seen[c]) {
        throw std::runtime_error("tensor '" + tensor.name + "' has a column order that is not a permutation of [0, " +
                                 std::to_string(cols) + ") (column " + std::to_string(c) + ")");
      }
      seen[c] = true;
    }
  }
}

}  // namespace troupe
