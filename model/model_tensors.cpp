#include "model/model_tensors.hpp"

#include <stdexcept>

namespace troupe {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<tensor_spec> expected_tensors(const model_config& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_size = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  std::vector<tensor_spec> specs;
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}, tensor_role::matrix});
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    specs.push_back({prefix + "input_layernorm.weight", {hidden}, tensor_role::norm});
    specs.push_back({prefix + "self_attn.q_proj.weight", {q_size, hidden}, tensor_role::matrix});
    specs.push_back({prefix + "self_attn.k_proj.weight", {kv_size, hidden}, tensor_role::matrix});
    specs.push_back({prefix + "self_attn.v_proj.weight", {kv_size, hidden}, tensor_role::matrix});
    if (config.attention_bias) {
      specs.push_back({prefix + "self_attn.q_proj.bias", {q_size}, tensor_role::bias});
      specs.push_back({prefix + "self_attn.k_proj.bias", {kv_size}, tensor_role::bias});
      specs.push_back({prefix + "self_attn.v_proj.bias", {kv_size}, tensor_role::bias});
    }
    if (config.qk_norm) {
      specs.push_back({prefix + "self_attn.q_norm.weight", {config.head_dim}, tensor_role::norm});
      specs.push_back({prefix + "self_attn.k_norm.weight", {config.head_dim}, tensor_role::norm});
    }
    specs.push_back({prefix + "self_attn.o_proj.weight", {hidden, q_size}, tensor_role::matrix});
    specs.push_back({prefix + "post_attention_layernorm.weight", {hidden}, tensor_role::norm});
    specs.push_back({prefix + "mlp.gate_proj.weight", {inter, hidden}, tensor_role::matrix});
    specs.push_back({prefix + "mlp.up_proj.weight", {inter, hidden}, tensor_role::matrix});
    specs.push_back({prefix + "mlp.down_proj.weight", {hidden, inter}, tensor_role::matrix});
  }
  specs.push_back({"model.norm.weight", {hidden}, tensor_role::norm});
  if (!config.tie_word_embeddings) specs.push_back({"lm_head.weight", {config.vocab_size, hidden}, tensor_role::matrix});
  return specs;
}

void validate_weights(const model_config& config, const weight_store& weights, const std::string& source) {
  for (const auto& spec : expected_tensors(config)) {
    const weight_tensor* tensor = weights.find(spec.name);
    if (!tensor) {
      throw std::runtime_error("tensor " + spec.name + " is missing; expected shape " + shape_string(spec.shape) +
                               " from " + source);
    }
    if (tensor->shape != spec.shape) {
      throw std::runtime_error("tensor " + spec.name + " has shape " + shape_string(tensor->shape) + ", expected " +
                               shape_string(spec.shape) + " from " + source);
    }
  }
}

}  // namespace troupe
