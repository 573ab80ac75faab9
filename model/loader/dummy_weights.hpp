#pragma once
// Deterministic random weights of a model's shape: for benchmarks without a checkpoint
// (--load-format dummy) and for the model maker.

#include <cstdint>
#include <vector>

#include "model/model_config.hpp"
#include "model/model_tensors.hpp"
#include "model/weight_store.hpp"

namespace troupe {

struct dummy_init {
  float stddev = 0.02f;       // matrices and biases: normal(0, stddev), small so activations stay sane
  float norm_jitter = 0.0f;   // norms: 1 + uniform(-jitter, jitter); 0 gives exactly 1
};

// The f32 values of one tensor. Depends only on (seed, spec.name, init), not on the order in
// which tensors are generated, so every format made from one seed holds the same weights.
std::vector<float> dummy_tensor_values(const tensor_spec& spec, uint64_t seed, const dummy_init& init = {});

// Every tensor of `config` in `type` (owned buffers, kept alive by the store).
weight_store make_dummy_weights(const model_config& config, dtype type, uint64_t seed, const dummy_init& init = {});

}  // namespace troupe
