#pragma once
// The shape and hyper-parameters of a Llama-family model, whatever file it came from.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

enum class architecture {
  llama,    // Llama 2 / 3.x (LlamaForCausalLM)
  mistral,  // MistralForCausalLM (Llama shape; a sliding window caps the context, see hf_config.cpp)
  qwen2,    // Qwen2ForCausalLM: q/k/v projections carry a bias
  qwen3,    // Qwen3ForCausalLM: RMSNorm on q and k per head, before RoPE
};

// Llama 3.x "rope_scaling": {"rope_type": "llama3", ...}. Other types are rejected at load.
struct rope_scaling_config {
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct model_config {
  architecture arch = architecture::llama;
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // hidden_size / num_heads unless config.json says otherwise (Qwen3)
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  std::optional<rope_scaling_config> rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k (Qwen3)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
};

}  // namespace troupe
