#include "model/model_tensors.hpp"

#include <stdexcept>

#include "model/architecture.hpp"
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
  return config.attention_bias || traits_of(config.arch).always_attention_bias;
}

bool has_qk_norm(const model_config& config) { return config.qk_norm || traits_of(config.arch).always_qk_norm; }

namespace {

// The routed experts' and router's names of one layer, as each family's checkpoints spell them.
void name_experts(const model_config& config, const std::string& prefix, layer_tensor_names& l) {
  const int num_experts = config.moe.num_experts;
  l.experts.resize(num_experts);
  if (config.arch == architecture::mixtral) {
    l.router = prefix + "block_sparse_moe.gate.weight";
    for (int e = 0; e < num_experts; ++e) {
      const std::string p = prefix + "block_sparse_moe.experts." + std::to_string(e) + ".";
      l.experts[e].gate_proj = p + "w1.weight";
      l.experts[e].down_proj = p + "w2.weight";
      l.experts[e].up_proj = p + "w3.weight";
    }
    return;
  }
  l.router = prefix + (config.arch == architecture::gpt_oss ? "mlp.router.weight" : "mlp.gate.weight");
  if (config.moe.router_bias) l.router_bias = prefix + "mlp.router.bias";
  for (int e = 0; e < num_experts; ++e) {
    const std::string p = prefix + "mlp.experts." + std::to_string(e) + ".";
    expert_tensor_names& x = l.experts[e];
    x.gate_proj = p + "gate_proj.weight";
    x.up_proj = p + "up_proj.weight";
    x.down_proj = p + "down_proj.weight";
    if (config.moe.expert_bias) {
      x.gate_bias = p + "gate_proj.bias";
      x.up_bias = p + "up_proj.bias";
      x.down_bias = p + "down_proj.bias";
    }
  }
  if (config.moe.shared_expert_intermediate_size > 0) {
    l.shared_gate_proj = prefix + "mlp.shared_expert.gate_proj.weight";
    l.shared_up_proj = prefix + "mlp.shared_expert.up_proj.weight";
    l.shared_down_proj = prefix + "mlp.shared_expert.down_proj.weight";
    l.shared_expert_gate = prefix + "mlp.shared_expert_gate.weight";
  }
}

}  // namespace

model_tensor_names tensor_names(const model_config& config) {
  const architecture_traits& traits = traits_of(config.arch);
  const bool bias = has_attention_bias(config);
  const bool qk_norm = has_qk_norm(config);
  model_tensor_names names;
  names.embed_tokens = "model.embed_tokens.weight";
  names.layers.reserve(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    layer_tensor_names l;
    l.attn_norm = prefix + "input_layernorm.weight";
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
    if (traits.output_bias) l.o_bias = prefix + "self_attn.o_proj.bias";
    if (config.attention_sinks) l.sinks = prefix + "self_attn.sinks";
    if (traits.post_block_norms) {
      // Gemma: "post_attention_layernorm" is a post-norm here, the MLP's pre-norm has its own name.
      l.attn_post_norm = prefix + "post_attention_layernorm.weight";
      l.ffn_norm = prefix + "pre_feedforward_layernorm.weight";
      l.ffn_post_norm = prefix + "post_feedforward_layernorm.weight";
    } else {
      l.ffn_norm = prefix + "post_attention_layernorm.weight";
    }
    if (is_moe_layer(config, layer)) {
      name_experts(config, prefix, l);
    } else {
      l.gate_proj = prefix + "mlp.gate_proj.weight";
      l.up_proj = prefix + "mlp.up_proj.weight";
      l.down_proj = prefix + "mlp.down_proj.weight";
    }
    names.layers.push_back(std::move(l));
  }
  names.final_norm = "model.norm.weight";
  names.lm_head = config.tie_word_embeddings ? names.embed_tokens : "lm_head.weight";
  return names;
}

std::vector<tensor_spec> expected_tensors(const model_config& config, layer_range layers) {
  layers = layers.resolved(config.num_layers);
  if (config.num_layers > 0) check_layer_range(layers, config.num_layers);
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_size = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  const int64_t expert_inter = config.moe.expert_intermediate_size;
  const int64_t shared_inter = config.moe.shared_expert_intermediate_size;
  const model_tensor_names names = tensor_names(config);
  const tensor_role norm_role =
      traits_of(config.arch).norm == norm_kind::rms_one_plus ? tensor_role::norm_offset : tensor_role::norm;
  std::vector<tensor_spec> specs;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, tensor_role role) {
    if (!name.empty()) specs.push_back({name, std::move(shape), role});
  };
  using enum tensor_role;
  const bool tied = names.lm_head == names.embed_tokens;
  if (layers.holds_embedding() || (tied && layers.holds_head(config.num_layers))) {
    add(names.embed_tokens, {config.vocab_size, hidden}, matrix);
  }
  for (int index = layers.first; index < layers.end; ++index) {
    const layer_tensor_names& l = names.layers[static_cast<size_t>(index)];
    add(l.attn_norm, {hidden}, norm_role);
    add(l.q_proj, {q_size, hidden}, matrix);
    add(l.k_proj, {kv_size, hidden}, matrix);
    add(l.v_proj, {kv_size, hidden}, matrix);
    add(l.q_bias, {q_size}, bias);
    add(l.k_bias, {kv_size}, bias);
    add(l.v_bias, {kv_size}, bias);
    add(l.q_norm, {config.head_dim}, norm_role);
    add(l.k_norm, {config.head_dim}, norm_role);
    add(l.o_proj, {hidden, q_size}, matrix);
    add(l.o_bias, {hidden}, bias);
    add(l.sinks, {config.num_heads}, sinks);
    add(l.attn_post_norm, {hidden}, norm_role);
    add(l.ffn_norm, {hidden}, norm_role);
    add(l.gate_proj, {inter, hidden}, matrix);
    add(l.up_proj, {inter, hidden}, matrix);
    add(l.down_proj, {hidden, inter}, matrix);
    add(l.router, {config.moe.num_experts, hidden}, matrix);
    add(l.router_bias, {config.moe.num_experts}, bias);
    for (const expert_tensor_names& x : l.experts) {
      add(x.gate_proj, {expert_inter, hidden}, matrix);
      add(x.up_proj, {expert_inter, hidden}, matrix);
      add(x.down_proj, {hidden, expert_inter}, matrix);
      add(x.gate_bias, {expert_inter}, bias);
      add(x.up_bias, {expert_inter}, bias);
      add(x.down_bias, {hidden}, bias);
    }
    add(l.shared_gate_proj, {shared_inter, hidden}, matrix);
    add(l.shared_up_proj, {shared_inter, hidden}, matrix);
    add(l.shared_down_proj, {hidden, shared_inter}, matrix);
    add(l.shared_expert_gate, {1, hidden}, matrix);
    add(l.ffn_post_norm, {hidden}, norm_role);
  }
  if (layers.holds_head(config.num_layers)) {
    add(names.final_norm, {hidden}, norm_role);
    if (!tied) add(names.lm_head, {config.vocab_size, hidden}, matrix);
  }
  return specs;
}

std::vector<std::string> stage_tensor_names(const model_config& config, layer_range layers) {
  std::vector<std::string> names;
  for (tensor_spec& spec : expected_tensors(config, layers)) names.push_back(std::move(spec.name));
  return names;
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
