#include "model/loader/gguf_model_metadata.hpp"

#include "model/architecture.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {
namespace {

void write_rope_gguf(gguf_writer& writer, const std::string& p, const model_config& config) {
  writer.set(p + "rope.freq_base", gguf_value::f32(config.rope_theta));
  writer.set(p + "rope.dimension_count", gguf_value::u32(rotary_dims(config)));
  if (config.rope_local_theta > 0) writer.set(p + "rope.freq_base_swa", gguf_value::f32(config.rope_local_theta));
  if (!config.rope_scaling) return;
  const rope_scaling_config& s = *config.rope_scaling;
  switch (s.type) {
    case rope_scaling_type::llama3:
      // llama.cpp reads Llama 3 scaling from rope_freqs.weight; Troupe also keeps the parameters.
      writer.set("troupe.rope_scaling.factor", gguf_value::f32(s.factor));
      writer.set("troupe.rope_scaling.low_freq_factor", gguf_value::f32(s.low_freq_factor));
      writer.set("troupe.rope_scaling.high_freq_factor", gguf_value::f32(s.high_freq_factor));
      writer.set("troupe.rope_scaling.original_max_position_embeddings",
                 gguf_value::u32(s.original_max_position_embeddings));
      break;
    case rope_scaling_type::linear:
      writer.set(p + "rope.scaling.type", gguf_value::string("linear"));
      writer.set(p + "rope.scaling.factor", gguf_value::f32(s.factor));
      break;
    case rope_scaling_type::dynamic:
      // No such type in GGUF: the static NTK form is a plain rotation with a grown base.
      writer.set(p + "rope.freq_base", gguf_value::f32(dynamic_ntk_base(config)));
      break;
    case rope_scaling_type::yarn:
      writer.set(p + "rope.scaling.type", gguf_value::string("yarn"));
      writer.set(p + "rope.scaling.factor", gguf_value::f32(s.factor));
      writer.set(p + "rope.scaling.original_context_length", gguf_value::u32(s.original_max_position_embeddings));
      writer.set(p + "rope.scaling.yarn_beta_fast", gguf_value::f32(s.beta_fast));
      writer.set(p + "rope.scaling.yarn_beta_slow", gguf_value::f32(s.beta_slow));
      break;
    case rope_scaling_type::longrope:
      writer.set(p + "rope.scaling.original_context_length", gguf_value::u32(s.original_max_position_embeddings));
      writer.set(p + "rope.scaling.attn_factor", gguf_value::f32(s.attention_factor));
      break;
  }
}

}  // namespace

std::string gguf_architecture_name(const model_config& config) { return std::string(traits_of(config.arch).gguf_name); }

void add_model_metadata(gguf_writer& writer, const model_config& config, const std::string& name) {
  const std::string p = gguf_architecture_name(config) + ".";
  writer.set("general.architecture", gguf_value::string(gguf_architecture_name(config)));
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
  writer.set(p + "vocab_size", gguf_value::u32(config.vocab_size));
  write_rope_gguf(writer, p, config);
  if (config.moe.num_experts > 0) {
    writer.set(p + "expert_count", gguf_value::u32(config.moe.num_experts));
    writer.set(p + "expert_used_count", gguf_value::u32(config.moe.experts_per_token));
    writer.set(p + "expert_feed_forward_length", gguf_value::u32(config.moe.expert_intermediate_size));
    if (config.moe.shared_expert_intermediate_size > 0) {
      writer.set(p + "expert_shared_feed_forward_length", gguf_value::u32(config.moe.shared_expert_intermediate_size));
    }
  }
  if (config.arch == architecture::gemma2) {
    writer.set(p + "attn_logit_softcapping", gguf_value::f32(config.attn_logit_softcapping));
    writer.set(p + "final_logit_softcapping", gguf_value::f32(config.final_logit_softcapping));
  } else if (config.final_logit_softcapping > 0) {
    writer.set(p + "final_logit_softcapping", gguf_value::f32(config.final_logit_softcapping));
  }
  if (config.sliding_window > 0) writer.set(p + "attention.sliding_window", gguf_value::u32(config.sliding_window));
  if (config.arch == architecture::phi3) writer.set(p + "attention.sliding_window", gguf_value::u32(0));
}

std::vector<gguf_extra_tensor> gguf_rope_tensors(const model_config& config) {
  std::vector<gguf_extra_tensor> tensors;
  if (!config.rope_scaling) return tensors;
  if (config.rope_scaling->type == rope_scaling_type::llama3) {
    tensors.push_back({"rope_freqs.weight", llama3_rope_factors(config)});
  } else if (config.rope_scaling->type == rope_scaling_type::longrope) {
    tensors.push_back({"rope_factors_long.weight", config.rope_scaling->long_factor});
    tensors.push_back({"rope_factors_short.weight", config.rope_scaling->short_factor});
  }
  return tensors;
}

}  // namespace troupe
