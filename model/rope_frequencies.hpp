#pragma once
// RoPE inverse frequencies as transformers computes them (in f32), for every backend: the CPU
// turns them into angles per token, CUDA uploads them once.

#include <vector>

#include "model/model_config.hpp"

namespace troupe {

// [head_dim / 2]: inv_freq[i] = rope_theta^(-2i/head_dim), rescaled by Llama 3's "rope_scaling"
// when the config has one: long wavelengths (beyond original_max_position_embeddings /
// low_freq_factor) are slowed by `factor`, short ones (below original / high_freq_factor) kept,
// and the band between interpolated smoothly.
std::vector<float> rope_inv_freq(const model_config& config);

}  // namespace troupe
