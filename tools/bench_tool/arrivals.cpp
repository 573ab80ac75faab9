#include "tools/bench_tool/arrivals.hpp"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

namespace troupe::bench_tool {

std::vector<double> arrival_offsets(int num_requests, double rate, double burstiness, uint64_t seed) {
  if (!(rate > 0)) throw std::invalid_argument("--request-rate must be above 0 (or inf), not " + std::to_string(rate));
  if (!(burstiness > 0) || !std::isfinite(burstiness)) {
    throw std::invalid_argument("--burstiness must be a finite number above 0, not " + std::to_string(burstiness));
  }
  std::vector<double> offsets(num_requests, 0.0);
  if (std::isinf(rate)) return offsets;
  // The first request goes at once; gamma(shape k, scale 1 / (rate k)) has mean 1 / rate.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (int i = 1; i < num_requests; ++i) offsets[i] = offsets[i - 1] + gap(rng);
  return offsets;
}

}  // namespace troupe::bench_tool
