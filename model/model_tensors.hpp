#pragma once
// The tensors a model_config implies (canonical names and shapes): the one list the loader
// checks a weight_store against and every backend takes its weights from, so that which biases,
// norms, experts and output projection a model has is decided in one place.
//
// Canonical names are the Hugging Face checkpoint's where its tensors are usable as they are
// (Mixtral's block_sparse_moe.experts.3.w1, Gemma's pre_feedforward_layernorm). Where a
// checkpoint fuses or packs tensors, the canonical form is the unfused one and the loaders
// convert (model/loader/hf_tensor_forms.hpp, the GGUF loader): Phi-3's qkv_proj and
// gate_up_proj become q/k/v_proj and gate/up_proj views; gpt-oss's packed experts become
// mlp.experts.E.{gate,up,down}_proj with their biases.

#include <cstdint>
#include <string>
#include <vector>

#include "model/layer_range.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Q/K/V biases: Qwen2, Qwen2-MoE and gpt-oss always have them, others when the config says so.
bool has_attention_bias(const model_config& config);
// Per-head RMSNorm of q and k: Qwen3, Qwen3-MoE and Gemma 3 always have it, others when the config says so.
bool has_qk_norm(const model_config& config);

// One routed expert's SwiGLU (an empty bias name: no bias).
struct expert_tensor_names {
  std::string gate_proj, up_proj;  // [expert_intermediate, hidden]
  std::string down_proj;           // [hidden, expert_intermediate]
  std::string gate_bias, up_bias;  // [expert_intermediate]; gpt-oss
  std::string down_bias;           // [hidden]; gpt-oss
};

// The names of one decoder layer's tensors. Where the model has no such tensor the name is
// empty, and a backend must not look for it (a file may still hold one: it is ignored).
struct layer_tensor_names {
  std::string attn_norm;       // [hidden] before attention
  std::string q_proj;          // [num_heads * head_dim, hidden]
  std::string k_proj, v_proj;  // [num_kv_heads * head_dim, hidden]
  std::string q_bias;          // [num_heads * head_dim]; empty without attention bias
  std::string k_bias, v_bias;  // [num_kv_heads * head_dim]; empty without attention bias
  std::string q_norm, k_norm;  // [head_dim]; empty without q/k norm
  std::string o_proj;          // [hidden, num_heads * head_dim]
  std::string o_bias;          // [hidden]; gpt-oss
  std::string sinks;           // [num_heads]; gpt-oss
  std::string attn_post_norm;  // [hidden] on the attention output; Gemma
  std::string ffn_norm;        // [hidden] before the MLP or the experts
  std::string ffn_post_norm;   // [hidden] on the MLP output; Gemma
  // Dense MLP (empty in a mixture-of-experts layer).
  std::string gate_proj, up_proj;  // [intermediate, hidden]
  std::string down_proj;           // [hidden, intermediate]
  // Mixture of experts (empty in a dense layer).
  std::string router;                            // [num_experts, hidden]
  std::string router_bias;                       // [num_experts]; gpt-oss
  std::vector<expert_tensor_names> experts;      // [num_experts]
  std::string shared_gate_proj, shared_up_proj;  // [shared_intermediate, hidden]; Qwen2-MoE
  std::string shared_down_proj;                  // [hidden, shared_intermediate]
  std::string shared_expert_gate;                // [1, hidden]: sigmoid gate of the shared expert
};

struct model_tensor_names {
  std::string embed_tokens;  // [vocab, hidden]
  std::vector<layer_tensor_names> layers;
  std::string final_norm;  // [hidden]
  // The output projection [vocab, hidden]: "lm_head.weight", or embed_tokens when the
  // embeddings are tied (then an lm_head.weight in the file is ignored, as transformers does).
  std::string lm_head;
};

model_tensor_names tensor_names(const model_config& config);

enum class tensor_role {
  matrix,       // a linear layer or embedding: [out, in]
  norm,         // an RMSNorm weight (initialized near 1)
  norm_offset,  // an RMSNorm weight applied as (1 + w) (Gemma; initialized near 0)
  bias,         // a bias (attention, router, experts)
  sinks,        // gpt-oss: per-head attention sink logits
};

struct tensor_spec {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  tensor_role role = tensor_role::matrix;
};

// Every tensor of tensor_names(config), each once, in a stable order: embeddings, then layer by
// layer, then the final norm and lm_head (lm_head only when the embeddings are not tied).
// A pipeline stage's `layers` (model/layer_range.hpp) keep the embedding only on the first stage,
// the layers in the range, and the final norm and lm_head only on the last; the last stage of a
// tied model lists the embedding as its lm_head (the first stage lists it too).
std::vector<tensor_spec> expected_tensors(const model_config& config, layer_range layers = {});

// The names of expected_tensors(config, layers): what a stage of `layers` reads from the store.
std::vector<std::string> stage_tensor_names(const model_config& config, layer_range layers);

// Throws std::runtime_error for the first missing tensor or wrong shape:
// "tensor X has shape [a,b], expected [c,d] from <source>".
void validate_weights(const model_config& config, const weight_store& weights, const std::string& source);

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace troupe
