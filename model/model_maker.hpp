#pragma once
// Makes small random models of real architectures for tests and benchmarks: from ONE set of
// random weights, an HF directory (config.json, generation_config.json, model.safetensors,
// tokenizer files) and model.gguf with full tokenizer metadata that llama.cpp loads.

#include <cstdint>
#include <filesystem>
#include <string>

#include "model/dtype.hpp"
#include "model/model_config.hpp"

namespace troupe {

struct model_maker_options {
  std::string arch = "llama";  // llama | llama3 | mistral | qwen2 | qwen3
  int hidden_size = 64;
  int intermediate_size = 128;
  int num_layers = 2;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;        // 0: hidden_size / num_heads
  int vocab_size = 0;      // 0: the tokenizer's; otherwise must equal it
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  dtype type = dtype::f32;  // a quantized type applies to the GGUF; the HF copy then gets f16
  uint64_t seed = 0;
  float init_stddev = 0.02f;
  float norm_jitter = 0.1f;  // norms 1 ± jitter, so a norm applied wrongly shows in the output
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
