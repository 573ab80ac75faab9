#pragma once
// What distinguishes one architecture from another, as data: its names in each format and the
// switches the shared builders read (which norm, where norms sit, what the embeddings are
// scaled by, which tensors a checkpoint fuses). One row per architecture in architecture.cpp;
// backends build every layer from this and the model's tensors, never from the name.

#include <optional>
#include <string>
#include <string_view>

#include "model/model_config.hpp"

namespace troupe {

enum class norm_kind {
  rms,           // x / rms(x) * w
  rms_one_plus,  // x / rms(x) * (1 + w): Gemma stores the offset from 1
};

struct architecture_traits {
  architecture arch;
  std::string_view name;           // Troupe's name (make-model --arch): "qwen3_moe"
  std::string_view hf_name;        // config.json "architectures": "Qwen3MoeForCausalLM"
  std::string_view hf_model_type;  // config.json "model_type": "qwen3_moe"
  std::string_view gguf_name;      // general.architecture: "qwen3moe"
  norm_kind norm = norm_kind::rms;
  bool post_block_norms = false;       // Gemma: a norm on each block's output before the residual add
  bool scale_embeddings = false;       // Gemma: embeddings times sqrt(hidden_size)
  bool fused_qkv = false;              // checkpoints store qkv_proj [q + k + v, hidden] (Phi-3)
  bool fused_gate_up = false;          // checkpoints store gate_up_proj [2 * intermediate, hidden] (Phi-3)
  bool always_attention_bias = false;  // Qwen2, Qwen2-MoE: q/k/v biases whatever the config says
  bool always_qk_norm = false;         // Qwen3, Qwen3-MoE, Gemma 3
  bool output_bias = false;            // gpt-oss: o_proj carries a bias
  bool experts = false;                // a mixture of experts replaces the MLP
  bool gguf_permuted_qk = false;       // GGUF arch "llama": q/k rows interleaved for RoPE
};

const architecture_traits& traits_of(architecture arch);
// By Troupe's name ("gemma2"), by config.json's class name or by GGUF's name; nullopt if unknown.
std::optional<architecture> architecture_from_name(std::string_view name);
std::optional<architecture> architecture_from_hf_name(std::string_view hf_name);
std::optional<architecture> architecture_from_gguf_name(std::string_view gguf_name);
// "llama, mistral, ..." for error messages, in one of the three spellings.
std::string architecture_names();
std::string architecture_hf_names();
std::string architecture_gguf_names();

// The softmax scale of attention scores: query_pre_attn_scalar^-1/2 when set (Gemma), else
// head_dim^-1/2.
float attention_scale(const model_config& config);

// The dimensions RoPE turns in each head (rotary_dim, or head_dim when it is 0).
int rotary_dims(const model_config& config);

// How many positions back (its own included) the furthest-seeing layer attends: the window when
// every layer slides (Mistral v0.1), 0 when some layer sees the whole context (full attention,
// or the full layers of Gemma 2/3 and gpt-oss). Blocks further back than this can be released.
int attention_reach(const model_config& config);

// Whether layer `layer` has a mixture of experts instead of a dense MLP.
bool is_moe_layer(const model_config& config, int layer);

}  // namespace troupe
