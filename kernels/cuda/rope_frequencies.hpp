#pragma once
// RoPE inverse frequencies as transformers computes them (f32), with llama3 scaling applied.

#include <vector>

#include "kernels/model_config.hpp"

namespace troupe::cuda {

// [head_dim / 2]: theta^(-2i / head_dim), then the llama3 piecewise scaling when configured.
std::vector<float> rope_inv_freq(const model_config& config);

}  // namespace troupe::cuda
