#pragma once
// RoPE inverse frequencies as transformers' modeling_rope_utils computes them, for every
// backend: the CPU turns them into angles per token, CUDA uploads them once.

#include <vector>

#include "model/model_config.hpp"

namespace troupe {

struct rope_parameters {
  std::vector<float>
      inv_freq;  // [rotary_dims / 2]: dimension i (and i + rotary_dims/2) turns by position * inv_freq[i]
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN's and longrope's attention scaling)
};

// The frequencies of layer `layer`: inv_freq[i] = rope_theta^(-2i/rotary_dims), rescaled by the
// config's rope_scaling:
// - linear: divided by factor;
// - dynamic (NTK-aware): the base grown to theta * (factor^2 - factor + 1)^(d/(d-2)), its value
//   at factor times the original context (vLLM's static form: keys already cached never move);
// - llama3: long wavelengths (beyond original / low_freq_factor) slowed by factor, short ones
//   (below original / high_freq_factor) kept, the band between interpolated smoothly;
// - yarn: interpolated (divided by factor) below the beta_slow correction dimension,
//   extrapolated (kept) above beta_fast's, ramped linearly between; attention_factor
//   0.1 ln(factor) + 1 unless the config gives it (or mscale / mscale_all_dim);
// - longrope: divided per frequency by long_factor when the served context
//   (max_position_embeddings) exceeds the original, else by short_factor (llama.cpp decides by
//   its context size the same way; transformers switches when a sequence grows past it).
// Gemma 3's sliding layers (rope_local_theta set) use the local base, unscaled.
// Throws std::runtime_error for an odd or zero rotary dimension or factors of the wrong length.
rope_parameters rope_for_layer(const model_config& config, int layer);

// The full-attention layers' inverse frequencies (rope_for_layer of a layer that is not sliding).
std::vector<float> rope_inv_freq(const model_config& config);

// The base dynamic NTK scaling grows rope_theta to (GGUF has no dynamic type: the model maker
// writes this base instead, which is the same rotation).
float dynamic_ntk_base(const model_config& config);

// longrope's default attention factor: sqrt(1 + ln(s) / ln(original)) for s = max_position /
// original > 1, else 1 (transformers and llama.cpp's converter alike). Parsers call it while
// max_position_embeddings is still the checkpoint's, before a served context may lower it.
float longrope_attention_factor(int max_position_embeddings, int original_max_position_embeddings);

}  // namespace troupe
