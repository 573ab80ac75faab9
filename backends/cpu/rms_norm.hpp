#pragma once
// RMSNorm: out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight, row by row.

#include <cstdint>

#include "backends/cpu/thread_pool.hpp"

namespace troupe::cpu {

// x, out: [num_rows, dim] (out may alias x); weight: [dim]. The sum of squares is taken in
// double so that the result does not depend on how a row's elements are grouped.
void rms_norm(thread_pool& pool, const float* x, int64_t num_rows, int64_t dim, const float* weight, float eps,
              float* out);

}  // namespace troupe::cpu
