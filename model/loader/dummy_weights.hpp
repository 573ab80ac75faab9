#pragma once
// Deterministic random weights of a model's shape: for benchmarks without a checkpoint
// (--load-format dummy) and for the model maker.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/model_tensors.hpp"
#include "model/weight_store.hpp"

namespace troupe {

struct dummy_init {
  float stddev = 0.02f;      // matrices and biases: normal(0, stddev), small so activations stay sane
  float norm_jitter = 0.0f;  // norms: 1 + uniform(-jitter, jitter); 0 gives exactly 1
};

// The f32 values of one tensor. Depends only on (seed, spec.name, init), not on the order in
// which tensors are generated, so every format made from one seed holds the same weights.
std::vector<float> dummy_tensor_values(const tensor_spec& spec, uint64_t seed, const dummy_init& init = {});

// Every tensor of `config` in `type` (owned buffers, kept alive by the store).
// What dummy weights of `config` in `type` take, in bytes (double: an absurd config's sizes do not
// fit an integer): the weights, and the f32 values of the largest tensor while it is made.
struct dummy_weight_bytes {
  double weights = 0;
  double largest_values = 0;
};
dummy_weight_bytes dummy_weights_bytes(const model_config& config, dtype type);

// Throws std::runtime_error naming the sizes and the memory available when the weights cannot
// fit (issue 25: an absurd config ran 35 s and ended in a bare std::bad_alloc). `what` names the
// model in the message.
void check_dummy_weights_fit(const model_config& config, dtype type, const std::string& what);

weight_store make_dummy_weights(const model_config& config, dtype type, uint64_t seed, const dummy_init& init = {});

}  // namespace troupe
