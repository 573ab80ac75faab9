#pragma once
// SwiGLU's gate: out = silu(gate) * up, silu(x) = x / (1 + e^-x).

#include <cstdint>

#include "backends/cpu/thread_pool.hpp"

namespace troupe::cpu {

// gate, up, out: [num_rows, dim] with rows ld_in (gate, up) and ld_out (out) floats apart;
// out may alias gate.
void silu_mul(thread_pool& pool, const float* gate, const float* up, int64_t ld_in, int64_t num_rows, int64_t dim,
              float* out, int64_t ld_out);

}  // namespace troupe::cpu
