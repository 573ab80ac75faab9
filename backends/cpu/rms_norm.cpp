#include "backends/cpu/rms_norm.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::cpu {

void rms_norm(thread_pool& pool, const float* x, int64_t num_rows, int64_t dim, const float* weight, float eps,
              float* out) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim));
  pool.parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * dim;
      double sum_squares = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum_squares += static_cast<double>(row[i]) * row[i];
      const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(dim) + eps));
      float* dst = out + r * dim;
      for (int64_t i = 0; i < dim; ++i) dst[i] = row[i] * inv_rms * weight[i];
    }
  });
}

}  // namespace troupe::cpu
