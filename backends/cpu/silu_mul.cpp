#include "backends/cpu/silu_mul.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::cpu {

void silu_mul(thread_pool& pool, const float* gate, const float* up, int64_t ld_in, int64_t num_rows, int64_t dim,
              float* out, int64_t ld_out) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, dim));
  pool.parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate + r * ld_in;
      const float* u = up + r * ld_in;
      float* o = out + r * ld_out;
      for (int64_t i = 0; i < dim; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

}  // namespace troupe::cpu
