#pragma once
// Turns a GGUF file of architecture llama, qwen2 or qwen3 into a model_config and canonical
// HF-named weights (q/k rows of arch llama moved back to the HF rotate-half layout).

#include <vector>

#include "model/loader/gguf_file.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Throws naming the file for an unsupported general.architecture or a missing hyper-parameter.
model_config gguf_model_config(const gguf_file& file);

// Adds every tensor with an HF counterpart to `store` (mapped in place; un-permuted q/k in
// owned buffers) and keeps the mapping alive there.
void load_gguf_weights(const gguf_file& file, const model_config& config, weight_store& store);

// llama.cpp's per-frequency divisors for Llama 3 rope scaling (GGUF tensor rope_freqs.weight),
// head_dim / 2 values.
std::vector<float> llama3_rope_factors(const model_config& config);

}  // namespace troupe
