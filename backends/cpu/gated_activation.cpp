#include "backends/cpu/gated_activation.hpp"

#include <algorithm>
#include <cmath>

#include "backends/cpu/silu_mul.hpp"

namespace troupe::cpu {

void gated_activation(thread_pool& pool, const activation& act, const float* gate, const float* up, int64_t ld_in,
                      int64_t num_rows, int64_t dim, float* out, int64_t ld_out) {
  if (act.kind == activation_kind::silu) {
    silu_mul(pool, gate, up, ld_in, num_rows, dim, out, ld_out);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim));
  pool.parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate + r * ld_in;
      const float* u = up + r * ld_in;
      float* o = out + r * ld_out;
      if (act.kind == activation_kind::gelu_tanh) {
        constexpr float sqrt_2_over_pi = 0.7978845608028654f;
        for (int64_t i = 0; i < dim; ++i) {
          const float x = g[i];
          o[i] = 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * (x + 0.044715f * x * x * x))) * u[i];
        }
      } else {
        for (int64_t i = 0; i < dim; ++i) {
          const float x = std::min(g[i], act.limit);
          const float y = std::clamp(u[i], -act.limit, act.limit);
          o[i] = x / (1.0f + std::exp(-act.alpha * x)) * (y + 1.0f);
        }
      }
    }
  });
}

}  // namespace troupe::cpu
