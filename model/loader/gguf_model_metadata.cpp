#include "model/loader/gguf_model_metadata.hpp"

namespace troupe {

std::string gguf_architecture_name(const model_config& config) {
  switch (config.arch) {
    case architecture::llama:
    case architecture::mistral: return "llama";  // llama.cpp runs Mistral as llama
    case architecture::qwen2: return "qwen2";
    case architecture::qwen3: return "qwen3";
  }
  return "llama";
}

bool gguf_permutes_qk(const model_config& config) { return gguf_architecture_name(config) == "llama"; }

void add_model_metadata(gguf_writer& writer, const model_config& config, const std::string& name) {
  const std::string arch = gguf_architecture_name(config);
  const std::string p = arch + ".";
  writer.set("general.architecture", gguf_value::string(arch));
  writer.set("general.name", gguf_value::string(name));
  writer.set(p + "context_length", gguf_value::u32(config.max_position_embeddings));
  writer.set(p + "embedding_length", gguf_value::u32(config.hidden_size));
  writer.set(p + "feed_forward_length", gguf_value::u32(config.intermediate_size));
  writer.set(p + "block_count", gguf_value::u32(config.num_layers));
  writer.set(p + "attention.head_count", gguf_value::u32(config.num_heads));
  writer.set(p + "attention.head_count_kv", gguf_value::u32(config.num_kv_heads));
  writer.set(p + "attention.key_length", gguf_value::u32(config.head_dim));
  writer.set(p + "attention.value_length", gguf_value::u32(config.head_dim));
  writer.set(p + "attention.layer_norm_rms_epsilon", gguf_value::f32(config.rms_norm_eps));
  writer.set(p + "rope.freq_base", gguf_value::f32(config.rope_theta));
  writer.set(p + "rope.dimension_count", gguf_value::u32(config.head_dim));
  writer.set(p + "vocab_size", gguf_value::u32(config.vocab_size));
  if (config.rope_scaling) {
    // llama.cpp reads Llama 3 scaling from rope_freqs.weight; Troupe also keeps the parameters.
    writer.set("troupe.rope_scaling.factor", gguf_value::f32(config.rope_scaling->factor));
    writer.set("troupe.rope_scaling.low_freq_factor", gguf_value::f32(config.rope_scaling->low_freq_factor));
    writer.set("troupe.rope_scaling.high_freq_factor", gguf_value::f32(config.rope_scaling->high_freq_factor));
    writer.set("troupe.rope_scaling.original_max_position_embeddings",
               gguf_value::u32(config.rope_scaling->original_max_position_embeddings));
  }
}

}  // namespace troupe
