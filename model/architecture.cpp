#include "model/architecture.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace troupe {
namespace {

architecture_traits row(architecture arch, std::string_view name, std::string_view hf_name, std::string_view model_type,
                        std::string_view gguf_name) {
  architecture_traits t;
  t.arch = arch;
  t.name = name;
  t.hf_name = hf_name;
  t.hf_model_type = model_type;
  t.gguf_name = gguf_name;
  return t;
}

std::array<architecture_traits, 11> make_table() {
  std::array<architecture_traits, 11> table;
  auto& llama = table[static_cast<int>(architecture::llama)];
  llama = row(architecture::llama, "llama", "LlamaForCausalLM", "llama", "llama");
  llama.gguf_permuted_qk = true;

  auto& mistral = table[static_cast<int>(architecture::mistral)];
  mistral = row(architecture::mistral, "mistral", "MistralForCausalLM", "mistral",
                "llama");  // llama.cpp runs Mistral as llama
  mistral.gguf_permuted_qk = true;

  auto& qwen2 = table[static_cast<int>(architecture::qwen2)];
  qwen2 = row(architecture::qwen2, "qwen2", "Qwen2ForCausalLM", "qwen2", "qwen2");
  qwen2.always_attention_bias = true;

  auto& qwen3 = table[static_cast<int>(architecture::qwen3)];
  qwen3 = row(architecture::qwen3, "qwen3", "Qwen3ForCausalLM", "qwen3", "qwen3");
  qwen3.always_qk_norm = true;

  auto& mixtral = table[static_cast<int>(architecture::mixtral)];
  mixtral =
      row(architecture::mixtral, "mixtral", "MixtralForCausalLM", "mixtral", "llama");  // llama.cpp: llama with experts
  mixtral.gguf_permuted_qk = true;
  mixtral.experts = true;

  auto& qwen2_moe = table[static_cast<int>(architecture::qwen2_moe)];
  qwen2_moe = row(architecture::qwen2_moe, "qwen2_moe", "Qwen2MoeForCausalLM", "qwen2_moe", "qwen2moe");
  qwen2_moe.always_attention_bias = true;
  qwen2_moe.experts = true;

  auto& qwen3_moe = table[static_cast<int>(architecture::qwen3_moe)];
  qwen3_moe = row(architecture::qwen3_moe, "qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", "qwen3moe");
  qwen3_moe.always_qk_norm = true;
  qwen3_moe.experts = true;

  auto& gpt_oss = table[static_cast<int>(architecture::gpt_oss)];
  gpt_oss = row(architecture::gpt_oss, "gpt_oss", "GptOssForCausalLM", "gpt_oss", "gpt-oss");
  gpt_oss.always_attention_bias = true;
  gpt_oss.output_bias = true;
  gpt_oss.experts = true;

  auto& gemma2 = table[static_cast<int>(architecture::gemma2)];
  gemma2 = row(architecture::gemma2, "gemma2", "Gemma2ForCausalLM", "gemma2", "gemma2");
  gemma2.norm = norm_kind::rms_one_plus;
  gemma2.post_block_norms = true;
  gemma2.scale_embeddings = true;

  auto& gemma3 = table[static_cast<int>(architecture::gemma3)];
  gemma3 = row(architecture::gemma3, "gemma3", "Gemma3ForCausalLM", "gemma3_text", "gemma3");
  gemma3.norm = norm_kind::rms_one_plus;
  gemma3.post_block_norms = true;
  gemma3.scale_embeddings = true;
  gemma3.always_qk_norm = true;

  auto& phi3 = table[static_cast<int>(architecture::phi3)];
  phi3 = row(architecture::phi3, "phi3", "Phi3ForCausalLM", "phi3", "phi3");
  phi3.fused_qkv = true;
  phi3.fused_gate_up = true;
  return table;
}

const std::array<architecture_traits, 11>& table() {
  static const std::array<architecture_traits, 11> rows = make_table();
  return rows;
}

template <typename Field>
std::string joined(Field field) {
  std::vector<std::string_view> names;
  for (const auto& t : table()) {
    // "llama" is three rows' GGUF name: each spelling once.
    if (std::find(names.begin(), names.end(), field(t)) == names.end()) names.push_back(field(t));
  }
  std::string list;
  for (std::string_view name : names) list += (list.empty() ? "" : ", ") + std::string(name);
  return list;
}

}  // namespace

const architecture_traits& traits_of(architecture arch) {
  const int index = static_cast<int>(arch);
  if (index < 0 || index >= static_cast<int>(table().size())) throw std::logic_error("unknown architecture value");
  return table()[index];
}

std::optional<architecture> architecture_from_name(std::string_view name) {
  for (const auto& t : table())
    if (t.name == name) return t.arch;
  return std::nullopt;
}

std::optional<architecture> architecture_from_hf_name(std::string_view hf_name) {
  for (const auto& t : table())
    if (t.hf_name == hf_name) return t.arch;
  return std::nullopt;
}

std::optional<architecture> architecture_from_gguf_name(std::string_view gguf_name) {
  // Several rows share "llama"; the GGUF loader tells Mixtral from Llama by its experts.
  for (const auto& t : table())
    if (t.gguf_name == gguf_name) return t.arch;
  return std::nullopt;
}

std::string architecture_names() {
  return joined([](const architecture_traits& t) { return t.name; });
}
std::string architecture_hf_names() {
  return joined([](const architecture_traits& t) { return t.hf_name; });
}
std::string architecture_gguf_names() {
  return joined([](const architecture_traits& t) { return t.gguf_name; });
}

float attention_scale(const model_config& config) {
  const float scalar =
      config.query_pre_attn_scalar > 0 ? config.query_pre_attn_scalar : static_cast<float>(config.head_dim);
  return 1.0f / std::sqrt(scalar);
}

int rotary_dims(const model_config& config) { return config.rotary_dim > 0 ? config.rotary_dim : config.head_dim; }

int attention_reach(const model_config& config) {
  if (config.sliding_window <= 0 || config.sliding_layers.empty()) return 0;
  for (bool sliding : config.sliding_layers)
    if (!sliding) return 0;
  return config.sliding_window;
}

bool is_moe_layer(const model_config& config, int) { return config.moe.num_experts > 0; }

}  // namespace troupe
