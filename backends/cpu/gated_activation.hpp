#pragma once
// The gate of a gated MLP or expert: out = act(gate) * up, for each activation a model uses
// (model_config's activation_kind):
// - silu (SwiGLU): silu(g) * u, silu(x) = x / (1 + e^-x);
// - gelu_tanh (GeGLU, Gemma): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, transformers'
//   gelu_pytorch_tanh;
// - swiglu_oai (gpt-oss): g' = min(g, limit), u' = clamp(u, -limit, limit),
//   g' sigmoid(alpha g') (u' + 1).

#include <cstdint>

#include "backends/cpu/thread_pool.hpp"
#include "model/model_config.hpp"

namespace troupe::cpu {

struct activation {
  activation_kind kind = activation_kind::silu;
  float alpha = 1.702f;  // swiglu_oai
  float limit = 7.0f;    // swiglu_oai
};

// gate, up, out: [num_rows, dim] with rows ld_in (gate, up) and ld_out (out) floats apart;
// out may alias gate.
void gated_activation(thread_pool& pool, const activation& act, const float* gate, const float* up, int64_t ld_in,
                      int64_t num_rows, int64_t dim, float* out, int64_t ld_out);

}  // namespace troupe::cpu
