#include "model/model_tensors.hpp"

#include <stdexcept>

#include "model/weight_values.hpp"

namespace troupe {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

bool has_attention_bias(const model_config& config) {
  return config.attention_bias || config.arch == architecture::qwen2;
}

bool has_qk_norm(const model_config& config) { return config.qk_norm || config.arch == architecture::qwen3; }

model_tensor_names tensor_names(const model_config& config) {
  const bool bias = has_attention_bias(config);
  const bool qk_norm = has_qk_norm(config);
  model_tensor_names names;
  names.embed_tokens = "model.embed_tokens.weight";
  names.layers.reserve(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    layer_tensor_names l;
    l.input_norm = prefix + "input_layernorm.weight";
    l.q_proj = prefix + "self_attn.q_proj.weight";
    l.k_proj = prefix + "self_attn.k_proj.weight";
    l.v_proj = prefix + "self_attn.v_proj.weight";
    if (bias) {
      l.q_bias = prefix + "self_attn.q_proj.bias";
      l.k_bias = prefix + "self_attn.k_proj.bias";
      l.v_bias = prefix + "self_attn.v_proj.bias";
    }
    if (qk_norm) {
      l.q_norm = prefix + "self_attn.q_norm.weight";
      l.k_norm = prefix + "self_attn.k_norm.weight";
    }
    l.o_proj = prefix + "self_attn.o_proj.weight";
    l.post_attention_norm = prefix + "post_attention_layernorm.weight";
    l.gate_proj = prefix + "mlp.gate_proj.weight";
    l.up_proj = prefix + "mlp.up_proj.weight";
    l.down_proj = prefix + "mlp.down_proj.weight";
    names.layers.push_back(std::move(l));
  }
  names.final_norm = "model.norm.weight";
  names.lm_head = config.tie_word_embeddings ? names.embed_tokens : "lm_head.weight";
  return names;
}

std::vector<tensor_spec> expected_tensors(const model_config& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_size = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  const model_tensor_names names = tensor_names(config);
  std::vector<tensor_spec> specs;
  specs.push_back({names.embed_tokens, {config.vocab_size, hidden}, tensor_role::matrix});
  for (const layer_tensor_names& l : names.layers) {
    specs.push_back({l.input_norm, {hidden}, tensor_role::norm});
    specs.push_back({l.q_proj, {q_size, hidden}, tensor_role::matrix});
    specs.push_back({l.k_proj, {kv_size, hidden}, tensor_role::matrix});
    specs.push_back({l.v_proj, {kv_size, hidden}, tensor_role::matrix});
    if (!l.q_bias.empty()) {
      specs.push_back({l.q_bias, {q_size}, tensor_role::bias});
      specs.push_back({l.k_bias, {kv_size}, tensor_role::bias});
      specs.push_back({l.v_bias, {kv_size}, tensor_role::bias});
    }
    if (!l.q_norm.empty()) {
      specs.push_back({l.q_norm, {config.head_dim}, tensor_role::norm});
      specs.push_back({l.k_norm, {config.head_dim}, tensor_role::norm});
    }
    specs.push_back({l.o_proj, {hidden, q_size}, tensor_role::matrix});
    specs.push_back({l.post_attention_norm, {hidden}, tensor_role::norm});
    specs.push_back({l.gate_proj, {inter, hidden}, tensor_role::matrix});
    specs.push_back({l.up_proj, {inter, hidden}, tensor_role::matrix});
    specs.push_back({l.down_proj, {hidden, inter}, tensor_role::matrix});
  }
  specs.push_back({names.final_norm, {hidden}, tensor_role::norm});
  if (names.lm_head != names.embed_tokens) specs.push_back({names.lm_head, {config.vocab_size, hidden}, tensor_role::matrix});
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
    check_weight_layout(*tensor);
  }
}

}  // namespace troupe
