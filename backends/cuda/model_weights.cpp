#include "backends/cuda/model_weights.hpp"

#include <algorithm>
#include <stdexcept>

#include "backends/cuda/linear.hpp"
#include "backends/cuda/ops.hpp"
#include "model/model_tensors.hpp"

namespace troupe::cuda {

namespace {

const weight_tensor& expect(const weight_store& weights, const std::string& name, std::vector<int64_t> shape) {
  const weight_tensor& tensor = weights.get(name);
  if (tensor.shape != shape) {
    throw std::runtime_error("cuda model: tensor '" + name + "' has shape " + shape_string(tensor.shape) +
                             ", expected " + shape_string(shape));
  }
  return tensor;
}

}  // namespace

model_weights::model_weights(const model_config& config, const weight_store& weights, dtype activation,
                             cudaStream_t stream)
    : config_(config), activation_(activation) {
  const model_config& c = config_;
  const int64_t hidden = c.hidden_size, q_width = int64_t{c.num_heads} * c.head_dim,
                kv_width = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  device_buffer staging;  // for weights uploaded in another dtype; freed once all are up
  // Which tensors the model has (biases, q/k norms, its own lm_head) is the loader's list.
  const model_tensor_names names = tensor_names(c);
  embed_ = upload_linear({&expect(weights, names.embed_tokens, {c.vocab_size, hidden})}, staging, stream);
  final_norm_ = upload({&expect(weights, names.final_norm, {hidden})}, staging, stream);
  // Tied: the output layer reads the embedding table's own storage.
  lm_head_ = names.lm_head != names.embed_tokens
                 ? upload_linear({&expect(weights, names.lm_head, {c.vocab_size, hidden})}, staging, stream)
                 : embed_;
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const layer_tensor_names& n = names.layers[i];
    layer_weights& l = layers_[i];
    l.qkv =
        upload_linear({&expect(weights, n.q_proj, {q_width, hidden}), &expect(weights, n.k_proj, {kv_width, hidden}),
                       &expect(weights, n.v_proj, {kv_width, hidden})},
                      staging, stream);
    if (!n.q_bias.empty()) {
      l.qkv_bias = upload({&expect(weights, n.q_bias, {q_width}), &expect(weights, n.k_bias, {kv_width}),
                           &expect(weights, n.v_bias, {kv_width})},
                          staging, stream);
    }
    l.o = upload_linear({&expect(weights, n.o_proj, {hidden, q_width})}, staging, stream);
    l.gate_up =
        upload_linear({&expect(weights, n.gate_proj, {inter, hidden}), &expect(weights, n.up_proj, {inter, hidden})},
                      staging, stream);
    l.down = upload_linear({&expect(weights, n.down_proj, {hidden, inter})}, staging, stream);
    l.input_norm = upload({&expect(weights, n.attn_norm, {hidden})}, staging, stream);
    l.post_attn_norm = upload({&expect(weights, n.ffn_norm, {hidden})}, staging, stream);
    if (!n.q_norm.empty()) {
      l.q_norm = upload({&expect(weights, n.q_norm, {c.head_dim})}, staging, stream);
      l.k_norm = upload({&expect(weights, n.k_norm, {c.head_dim})}, staging, stream);
    }
  }
}

// The tensors in `parts`, back to back, converted to the activation dtype (norms, biases).
device_buffer model_weights::upload(const std::vector<const weight_tensor*>& parts, device_buffer& staging,
                                    cudaStream_t stream) {
  int64_t elements = 0;
  for (const weight_tensor* part : parts) elements += part->num_elements();
  device_buffer buffer(row_bytes(activation_, elements));
  char* cursor = buffer.as<char>();
  for (const weight_tensor* part : parts) {
    upload_converted(*part, activation_, cursor, staging, stream);
    cursor += row_bytes(activation_, part->num_elements());
    count_tensor(*part, activation_);
  }
  bytes_ += buffer.size();
  return buffer;
}

// A linear layer's weight: block types as stored, the rest in the activation dtype.
linear_weight model_weights::upload_linear(const std::vector<const weight_tensor*>& parts, device_buffer& staging,
                                           cudaStream_t stream) {
  linear_weight weight = upload_linear_weight(parts, activation_, staging, stream);
  for (const weight_tensor* part : parts) count_tensor(*part, stored_quantized(*part) ? part->type : activation_);
  bytes_ += weight.bytes();
  return weight;
}

void model_weights::count_tensor(const weight_tensor& tensor, dtype on_device) {
  std::string key(dtype_name(on_device));
  if (on_device != tensor.type) key = std::string(dtype_name(tensor.type)) + "->" + key;
  ++tensor_counts_[key];
}

std::string model_weights::tensor_counts() const {
  std::string counts;
  for (const auto& [type, count] : tensor_counts_)
    counts += (counts.empty() ? "" : ", ") + type + ": " + std::to_string(count);
  return counts;
}

size_t model_weights::dequantize_scratch_bytes(size_t cap) const {
  size_t scratch = 0;
  auto need = [&](const linear_weight& w) {
    scratch = std::max(scratch, cuda::dequantize_scratch_bytes(w, activation_, cap));
  };
  need(lm_head_);
  for (const layer_weights& l : layers_) {
    need(l.qkv);
    need(l.o);
    need(l.gate_up);
    need(l.down);
  }
  return scratch;
}

void model_weights::embed(const int32_t* ids, void* out, int n, cudaStream_t stream) const {
  const linear_part& part = embed_.parts.front();
  if (kept_quantized(part.type)) {
    dequantize_rows(embed_.data(part), part.type, embed_.row_scales_from(0), config_.hidden_size, ids, 0, n, out,
                    config_.hidden_size, activation_, stream);
  } else {
    embedding(embed_.data(part), ids, out, n, config_.hidden_size, activation_, stream);
  }
}

}  // namespace troupe::cuda
