#pragma once
// Makes small random models of real architectures for tests and benchmarks: from ONE set of
// random weights, an HF directory (config.json, generation_config.json, model.safetensors,
// tokenizer files) and model.gguf with full tokenizer metadata that llama.cpp loads.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "model/dtype.hpp"
#include "model/model_config.hpp"

namespace troupe {

struct model_maker_options {
  // llama | llama3 | mistral | qwen2 | qwen3 | mixtral | qwen2_moe | qwen3_moe | gpt_oss | gemma2 |
  // gemma3 | phi3 (llama3: llama with Llama 3.1's rope scaling)
  std::string arch = "llama";
  int hidden_size = 64;
  int intermediate_size = 128;
  int num_layers = 2;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;    // 0: hidden_size / num_heads
  int vocab_size = 0;  // 0: the tokenizer's; otherwise must equal it
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;  // Gemma always ties
  // Mixture of experts (0: the architecture's small default).
  int num_experts = 0;                      // 8
  int experts_per_token = 0;                // 2
  int expert_intermediate_size = 0;         // intermediate_size / 2 (Qwen MoE); Mixtral and gpt-oss: intermediate_size
  int shared_expert_intermediate_size = 0;  // Qwen2-MoE: intermediate_size
  std::optional<bool> norm_topk_prob;       // Qwen MoE: false for qwen2_moe, true for qwen3_moe
  // Attention extras.
  int sliding_window = 0;  // 0: the architecture's (Gemma 2: 4096, Gemma 3: 512, gpt-oss: 128, Mistral: none)
  std::optional<float> attn_logit_softcapping;   // Gemma 2: 50
  std::optional<float> final_logit_softcapping;  // Gemma 2: 30
  // gpt-oss: random sinks; without, every sink is -infinity (inert, as if the model had none).
  bool attention_sinks = false;
  int rotary_dim = 0;  // 0: head_dim; smaller turns only the first rotary_dim of each head
  // "" (the architecture's: llama3 for arch llama3, none otherwise) | none | linear | dynamic |
  // llama3 | yarn | longrope; factor 0: 8 for llama3, 4 otherwise. The original context is
  // max_position_embeddings / factor.
  std::string rope_scaling;
  float rope_scaling_factor = 0.0f;
  dtype type = dtype::f32;  // a quantized type applies to the GGUF; the HF copy then gets f16
  uint64_t seed = 0;
  float init_stddev = 0.02f;
  float norm_jitter = 0.1f;         // norms 1 ± jitter, so a norm applied wrongly shows in the output
  std::filesystem::path tokenizer;  // HF dir, tokenizer.json or .gguf
  std::filesystem::path out;        // directory to create / fill
};

struct made_model {
  model_config config;
  std::filesystem::path hf_dir;     // == options.out
  std::filesystem::path gguf_path;  // out / "model.gguf"
};

// The config the options describe (vocab_size as given). Throws naming a bad option.
model_config model_maker_config(const model_maker_options& options, int vocab_size);

made_model make_model(const model_maker_options& options);

}  // namespace troupe
