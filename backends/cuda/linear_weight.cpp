#include "backends/cuda/linear_weight.hpp"

#include <stdexcept>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/quant_blocks.cuh"
#include "model/quant/dequantize.hpp"

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

bool linear_weight::quantized() const {
  for (const linear_part& part : parts) {
    if (is_quantized(part.type)) return true;
  }
  return false;
}

void upload_converted(const weight_tensor& tensor, dtype to, void* destination, device_buffer& staging,
                      cudaStream_t stream) {
  if (tensor.type == to) {
    check(cudaMemcpy(destination, tensor.data, tensor.num_bytes, cudaMemcpyHostToDevice), "upload weight");
    return;
  }
  if (tensor.type != dtype::f32 && tensor.type != dtype::f16 && tensor.type != dtype::bf16 && tensor.type != dtype::q8_0) {
    // A type without a device conversion (FP8, or a block type headed for a plain tensor): decoded to f32 on the host.
    std::vector<float> decoded(static_cast<size_t>(tensor.num_elements()));
    quant::dequantize_row(tensor.type, tensor.data, decoded.data(), tensor.num_elements());
    if (staging.size() < decoded.size() * 4) staging.allocate(decoded.size() * 4);
    check(cudaMemcpy(staging.get(), decoded.data(), decoded.size() * 4, cudaMemcpyHostToDevice), "upload weight");
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
    size_t offset;  // within the storage
  };
  std::vector<placed> placements;
  size_t offset = 0;
  for (const weight_tensor* tensor : tensors) {
    if (tensor->shape.size() != 2 || tensor->cols() != weight.in_features) {
      throw std::runtime_error("cuda model: " + describe(*tensor) + " is not a matrix of " +
                               std::to_string(weight.in_features) + " columns like the others of its layer");
    }
    const dtype stored = kept_quantized(tensor->type) ? tensor->type : activation;
    const int rows = static_cast<int>(tensor->rows());
    size_t bytes;
    if (is_quantized(stored)) {
      const int64_t block = dtype_block_size(stored);
      if (tensor->cols() % block != 0) {
        throw std::runtime_error("cuda model: " + describe(*tensor) + " has rows of " + std::to_string(tensor->cols()) +
                                 " values, not whole " + std::to_string(block) + "-value blocks of its type");
      }
      bytes = static_cast<size_t>(rows) * row_bytes(stored, tensor->cols());
      if (tensor->num_bytes != bytes) {
        throw std::runtime_error("cuda model: " + describe(*tensor) + " holds " + std::to_string(tensor->num_bytes) +
                                 " bytes, its shape and type take " + std::to_string(bytes));
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
    placements.push_back({tensor, offset});
    offset += bytes;
    weight.out_features += rows;
  }
  weight.storage = std::make_shared<device_buffer>(offset);
  for (const placed& p : placements) {
    void* destination = weight.storage->as<std::byte>() + p.offset;
    if (kept_quantized(p.tensor->type)) {
      check(cudaMemcpy(destination, p.tensor->data, p.tensor->num_bytes, cudaMemcpyHostToDevice), "upload weight");
    } else {
      upload_converted(*p.tensor, activation, destination, staging, stream);
    }
  }
  return weight;
}

}  // namespace troupe::cuda
