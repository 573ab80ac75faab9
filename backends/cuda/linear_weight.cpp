#include "backends/cuda/linear_weight.hpp"

#include <algorithm>
#include <stdexcept>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/quant_blocks.cuh"
#include "model/weight_values.hpp"

namespace troupe::cuda {

namespace {

size_t element_bytes(dtype type) { return type == dtype::f32 ? 4 : 2; }

std::string describe(const weight_tensor& tensor) {
  std::string s = "tensor '" + tensor.name + "' (" + std::string(dtype_name(tensor.type)) + " [";
  for (size_t i = 0; i < tensor.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(tensor.shape[i]);
  return s + "])";
}

}  // namespace

bool kept_quantized(dtype type) {
  return quant_blocks::visit(type, [](auto) {});
}

bool stored_quantized(const weight_tensor& tensor) {
  if (!kept_quantized(tensor.type) || !tensor.input_order.empty()) return false;
  // FP8 E4M3 is one element a registry block but is read 32 at a time: a row of another width
  // is converted instead (block types' rows are whole blocks by their shape already).
  const int decoder_block = quant_blocks::decoder_block_size(tensor.type);
  return dtype_block_size(tensor.type) == decoder_block ||
         (tensor.shape.size() == 2 && tensor.cols() % decoder_block == 0);
}

bool linear_weight::quantized() const {
  for (const linear_part& part : parts) {
    if (kept_quantized(part.type)) return true;
  }
  return false;
}

const float* linear_weight::row_scales_from(int row) const {
  return row_scales ? row_scales->as<float>() + row : nullptr;
}

void upload_converted(const weight_tensor& tensor, dtype to, void* destination, device_buffer& staging,
                      cudaStream_t stream) {
  if (tensor.type == to && tensor.plain()) {
    check(cudaMemcpy(destination, tensor.data, tensor.num_bytes, cudaMemcpyHostToDevice), "upload weight");
    return;
  }
  const bool device_converts = tensor.type == dtype::f32 || tensor.type == dtype::f16 || tensor.type == dtype::bf16 ||
                               tensor.type == dtype::q8_0;
  if (!device_converts || !tensor.plain()) {
    // A type without a device conversion, or a checkpoint's row scales or act-order columns: the
    // tensor's values (weight_rows_f32, the one definition of them) made on the host.
    std::vector<float> values(static_cast<size_t>(tensor.num_elements()));  // [rows, cols]
    weight_rows_f32(tensor, 0, tensor.rows(), values.data());
    if (staging.size() < values.size() * 4) staging.allocate(values.size() * 4);
    check(cudaMemcpy(staging.get(), values.data(), values.size() * 4, cudaMemcpyHostToDevice), "upload weight");
    convert(staging.get(), dtype::f32, destination, to, tensor.num_elements(), stream);
    check(cudaStreamSynchronize(stream), "convert weight");
    return;
  }
  if (staging.size() < tensor.num_bytes) staging.allocate(tensor.num_bytes);
  check(cudaMemcpy(staging.get(), tensor.data, tensor.num_bytes, cudaMemcpyHostToDevice), "upload weight");
  convert(staging.get(), tensor.type, destination, to, tensor.num_elements(), stream);
  check(cudaStreamSynchronize(stream), "convert weight");
}

linear_weight upload_linear_weight(const std::vector<const weight_tensor*>& tensors, dtype activation,
                                   device_buffer& staging, cudaStream_t stream) {
  linear_weight weight;
  if (tensors.empty()) return weight;
  weight.in_features = static_cast<int>(tensors.front()->cols());
  // The parts: consecutive tensors of one device type merge; each part starts 256-aligned.
  struct placed {
    const weight_tensor* tensor;
    bool quantized;  // copied as stored (else converted to the activation dtype)
    size_t offset;   // within the storage
    int first_row;
  };
  std::vector<placed> placements;
  bool any_row_scales = false;
  size_t offset = 0;
  for (const weight_tensor* tensor : tensors) {
    if (tensor->shape.size() != 2 || tensor->cols() != weight.in_features) {
      throw std::runtime_error("cuda model: " + describe(*tensor) + " is not a matrix of " +
                               std::to_string(weight.in_features) + " columns like the others of its layer");
    }
    const bool quantized = stored_quantized(*tensor);
    const dtype stored = quantized ? tensor->type : activation;
    const int rows = static_cast<int>(tensor->rows());
    size_t bytes;
    if (quantized) {
      const int block = quant_blocks::decoder_block_size(stored);
      if (tensor->cols() % block != 0) {
        throw std::runtime_error("cuda model: " + describe(*tensor) + " has rows of " + std::to_string(tensor->cols()) +
                                 " values, not whole " + std::to_string(block) + "-value blocks of its type");
      }
      bytes = static_cast<size_t>(rows) * row_bytes(stored, tensor->cols());
      if (tensor->num_bytes != bytes) {
        throw std::runtime_error("cuda model: " + describe(*tensor) + " holds " + std::to_string(tensor->num_bytes) +
                                 " bytes, its shape and type take " + std::to_string(bytes));
      }
      if (!tensor->row_scales.empty()) {
        check_weight_layout(*tensor);
        any_row_scales = true;
      }
    } else {
      bytes = static_cast<size_t>(rows) * tensor->cols() * element_bytes(stored);
    }
    if (!weight.parts.empty() && weight.parts.back().type == stored) {
      weight.parts.back().rows += rows;  // bytes continue the previous part: rows are whole
    } else {
      offset = (offset + 255) / 256 * 256;
      weight.parts.push_back(linear_part{stored, weight.out_features, rows, offset});
    }
    placements.push_back({tensor, quantized, offset, weight.out_features});
    offset += bytes;
    weight.out_features += rows;
  }
  weight.storage = std::make_shared<device_buffer>(offset);
  for (const placed& p : placements) {
    void* destination = weight.storage->as<std::byte>() + p.offset;
    if (p.quantized) {
      check(cudaMemcpy(destination, p.tensor->data, p.tensor->num_bytes, cudaMemcpyHostToDevice), "upload weight");
    } else {
      upload_converted(*p.tensor, activation, destination, staging, stream);
    }
  }
  if (any_row_scales) {
    // Rows converted on the host have their scale in their values already: 1 here.
    std::vector<float> scales(static_cast<size_t>(weight.out_features), 1.0f);  // [out_features]
    for (const placed& p : placements) {
      if (!p.quantized || p.tensor->row_scales.empty()) continue;
      std::copy(p.tensor->row_scales.begin(), p.tensor->row_scales.end(), scales.begin() + p.first_row);
    }
    weight.row_scales = std::make_shared<device_buffer>(scales.size() * sizeof(float));
    check(cudaMemcpy(weight.row_scales->get(), scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload row scales");
  }
  return weight;
}

}  // namespace troupe::cuda
