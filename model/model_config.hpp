#pragma once
// The shape and hyper-parameters of a decoder-only transformer, whatever file it came from. An
// architecture is a name plus a few switches (which norms, which activation, which attention
// extras, a dense MLP or a mixture of experts); model/architecture.hpp turns the name into the
// description backends build the forward pass from.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

enum class architecture {
  llama,      // Llama 2 / 3.x (LlamaForCausalLM)
  mistral,    // MistralForCausalLM (Llama shape; v0.1 slides a 4096 window over every layer)
  qwen2,      // Qwen2ForCausalLM: q/k/v projections carry a bias
  qwen3,      // Qwen3ForCausalLM: RMSNorm on q and k per head, before RoPE
  mixtral,    // MixtralForCausalLM: Llama attention, a softmax-routed mixture of SwiGLU experts
  qwen2_moe,  // Qwen2MoeForCausalLM: Qwen2 attention, routed experts plus a gated shared expert
  qwen3_moe,  // Qwen3MoeForCausalLM: Qwen3 attention, routed experts
  gpt_oss,    // GptOssForCausalLM: biased attention with sinks, biased router and experts, clamped SwiGLU
  gemma2,     // Gemma2ForCausalLM: GeGLU, (1 + w) RMSNorm before and after each block, logit soft-capping
  gemma3,     // Gemma3ForCausalLM (text): Gemma 2's shape with q/k norm, no attention soft-capping
  phi3,       // Phi3ForCausalLM (Phi-3, Phi-4): fused qkv and gate_up projections, longrope
};

// "rope_scaling" of config.json (or the GGUF rope.scaling.* keys), as transformers'
// modeling_rope_utils defines each type.
enum class rope_scaling_type {
  linear,    // positions divided by factor
  dynamic,   // NTK-aware: the base grown for factor x the original context (as vLLM does it)
  llama3,    // Llama 3.x: long wavelengths slowed by factor, a smooth band between
  yarn,      // YaRN: interpolation ramped in between beta_fast and beta_slow, attention scaled
  longrope,  // Phi-3 "su"/"longrope": per-frequency divisors, short or long by the context served
};

struct rope_scaling_config {
  rope_scaling_type type = rope_scaling_type::llama3;
  float factor = 1.0f;
  int original_max_position_embeddings = 0;  // 0: the config's max_position_embeddings
  // llama3
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // yarn
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 0.0f;  // DeepSeek's form of the attention factor (0: unset)
  float mscale_all_dim = 0.0f;
  bool truncate = true;  // floor/ceil the correction range (gpt-oss says false)
  // yarn and longrope: multiplies cos and sin (0: the type's default from factor)
  float attention_factor = 0.0f;
  // longrope: [rotary_dim / 2] divisors of each frequency
  std::vector<float> short_factor;
  std::vector<float> long_factor;
};

// Llama 3.x's rope_scaling.
inline rope_scaling_config llama3_rope_scaling(float factor, float low_freq_factor, float high_freq_factor,
                                               int original) {
  rope_scaling_config s;
  s.type = rope_scaling_type::llama3;
  s.factor = factor;
  s.low_freq_factor = low_freq_factor;
  s.high_freq_factor = high_freq_factor;
  s.original_max_position_embeddings = original;
  return s;
}

// How a token's router logits become its experts' weights.
enum class router_scoring {
  softmax,             // softmax over all experts, then top-k (Mixtral, Qwen MoE)
  sigmoid,             // sigmoid per expert, then top-k (DeepSeek-V3 style)
  softmax_over_top_k,  // top-k of the raw logits, softmax over those k (gpt-oss)
};

// The mixture-of-experts block of the layers that have one (num_experts > 0).
struct moe_config {
  int num_experts = 0;
  int experts_per_token = 0;                // top-k
  int expert_intermediate_size = 0;         // each expert's SwiGLU width
  int shared_expert_intermediate_size = 0;  // 0: no shared expert (Qwen2-MoE has one, with a sigmoid gate)
  router_scoring scoring = router_scoring::softmax;
  bool norm_topk_prob = false;         // renormalise the k weights to sum to 1
  float routed_scaling_factor = 1.0f;  // multiplies the routed experts' weights
  bool router_bias = false;            // gpt-oss
  bool expert_bias = false;            // gpt-oss: gate/up/down of every expert carry a bias
};

enum class activation_kind {
  silu,        // SwiGLU: silu(gate) * up
  gelu_tanh,   // GeGLU: gelu_pytorch_tanh(gate) * up (Gemma)
  swiglu_oai,  // gpt-oss: gate clamped above at limit, up to [-limit, limit], gate*sigmoid(alpha*gate)*(up+1)
};

struct model_config {
  architecture arch = architecture::llama;
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  int hidden_size = 0;
  int intermediate_size = 0;  // the dense MLP's width (layers without experts)
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // hidden_size / num_heads unless config.json says otherwise (Qwen3, Gemma)
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int rotary_dim = 0;  // RoPE turns the first rotary_dim of each head (0: all; Phi-4-mini: 3/4)
  std::optional<rope_scaling_config> rope_scaling;
  // Gemma 3: sliding layers turn by this base, unscaled (0: every layer as the config says).
  float rope_local_theta = 0.0f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2; gpt-oss also biases o)
  bool qk_norm = false;         // per-head RMSNorm of q and k (Qwen3, Gemma 3)
  activation_kind activation = activation_kind::silu;
  float swiglu_alpha = 1.702f;  // swiglu_oai
  float swiglu_limit = 7.0f;    // swiglu_oai
  moe_config moe;               // num_experts == 0: every layer has a dense MLP
  // Attention extras. A scale of 0 means 1/sqrt(head_dim); Gemma sets query_pre_attn_scalar.
  float query_pre_attn_scalar = 0.0f;
  float attn_logit_softcapping = 0.0f;   // 0: none; Gemma 2: scores = cap * tanh(scores / cap)
  float final_logit_softcapping = 0.0f;  // 0: none; Gemma 2: logits = cap * tanh(logits / cap)
  bool attention_sinks = false;          // gpt-oss: a learned per-head logit in every softmax
  int sliding_window = 0;                // 0: none
  std::vector<bool> sliding_layers;      // [num_layers] true where a layer attends to the window only
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
};

}  // namespace troupe
