#include "model/loader/fp8_checkpoint.hpp"

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "model/model_tensors.hpp"
#include "model/quant/fp8.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const std::string& tensor, const std::string& problem) {
  throw std::runtime_error("tensor '" + tensor + "' " + problem);
}

// The scales as f32, each checked finite.
std::vector<float> read_scales(const safetensors_tensor& scale) {
  if (scale.is_integer()) fail(scale.name, "is " + scale.type_name + ", expected a float scale");
  std::vector<float> values(static_cast<size_t>(scale.num_elements()));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = scale.float_at(static_cast<int64_t>(i));
    if (!std::isfinite(values[i])) {
      fail(scale.name,
           "holds " + std::to_string(values[i]) + " at element " + std::to_string(i) + " (NaN or infinite)");
    }
  }
  return values;
}

// E4M3FN has no infinities; S.1111.111 is NaN, and a NaN weight would turn every output it
// enters into NaN.
void check_no_nan(const safetensors_tensor& weight) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(weight.data);
  for (int64_t i = 0; i < weight.num_elements(); ++i) {
    if ((bytes[i] & 0x7f) == 0x7f) {
      const int64_t cols = weight.shape[1];
      fail(weight.name, "holds an FP8 NaN at row " + std::to_string(i / cols) + ", column " + std::to_string(i % cols));
    }
  }
}

// Rows of `weight` as fp8_e4m3_b128 blocks, block (r, c) taking the scale of scale block
// (r / block_rows, 128 c / block_cols).
std::shared_ptr<std::vector<std::byte>> to_b128_blocks(const safetensors_tensor& weight,
                                                       const std::vector<float>& scales, int64_t block_rows,
                                                       int64_t block_cols) {
  const int64_t rows = weight.shape[0];
  const int64_t cols = weight.shape[1];
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  const int64_t blocks_per_row = cols / quant::fp8_b128_block_size;
  auto buffer = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(rows * blocks_per_row) *
                                                         quant::fp8_b128_block_bytes);  // [rows, cols / 128 blocks]
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const int64_t col = b * quant::fp8_b128_block_size;
      const float scale = scales[(r / block_rows) * scale_cols + col / block_cols];
      std::byte* out = buffer->data() + (r * blocks_per_row + b) * quant::fp8_b128_block_bytes;
      std::memcpy(out, &scale, 4);
      std::memcpy(out + 4, weight.data + r * cols + col, quant::fp8_b128_block_size);
    }
  }
  return buffer;
}

}  // namespace

unpacked_weight read_fp8_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                               const hf_quantization& q) {
  const std::string name = prefix + ".weight";
  const safetensors_tensor* weight = checkpoint.find(name);
  if (!weight) fail(name, "is missing");
  if (weight->type_name != "F8_E4M3") fail(name, "is " + weight->type_name + ", expected F8_E4M3");
  if (weight->shape.size() != 2)
    fail(name, "has shape " + shape_string(weight->shape) + ", expected [out_features, in_features]");
  const safetensors_tensor* scale = checkpoint.find(prefix + ".weight_scale_inv");
  if (!scale) scale = checkpoint.find(prefix + ".weight_scale");
  if (!scale) {
    fail(prefix + ".weight_scale", "is missing: the FP8 weight " + name + " needs its scale (" + q.source + ")");
  }
  check_no_nan(*weight);
  const std::vector<float> scales = read_scales(*scale);
  const int64_t rows = weight->shape[0];
  const int64_t cols = weight->shape[1];

  weight_tensor tensor = weight->as_weight();
  if (scales.size() == 1) {
    tensor.row_scales.assign(static_cast<size_t>(rows), scales[0]);
    return {std::move(tensor), nullptr};
  }
  if (scale->shape == std::vector<int64_t>{rows} || scale->shape == std::vector<int64_t>{rows, 1}) {
    tensor.row_scales = scales;
    return {std::move(tensor), nullptr};
  }
  if (!q.weight_block) {
    fail(scale->name, "has shape " + shape_string(scale->shape) + ", expected one scale, or one per output row [" +
                          std::to_string(rows) + "] (" + q.source + " declares no weight blocks)");
  }
  const auto [block_rows, block_cols] = *q.weight_block;
  const std::vector<int64_t> grid = {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols};
  if (scale->shape != grid) {
    fail(scale->name, "has shape " + shape_string(scale->shape) + ", expected " + shape_string(grid) +
                          " for blocks of " + std::to_string(block_rows) + "x" + std::to_string(block_cols) + " of " +
                          name + " " + shape_string(weight->shape));
  }
  if (cols % quant::fp8_b128_block_size != 0 || block_cols % quant::fp8_b128_block_size != 0) {
    fail(name, "has " + std::to_string(cols) + " columns in scale blocks of " + std::to_string(block_cols) +
                   "; block-scaled FP8 loads when both are multiples of 128 (each 128 columns of a row share a scale)");
  }
  auto buffer = to_b128_blocks(*weight, scales, block_rows, block_cols);
  tensor.type = dtype::fp8_e4m3_b128;
  tensor.data = buffer->data();
  tensor.num_bytes = buffer->size();
  return {std::move(tensor), std::move(buffer)};
}

}  // namespace troupe
