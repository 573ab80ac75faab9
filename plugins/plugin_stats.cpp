#include "plugins/plugin_stats.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

void plugin_stats::record(int64_t elapsed_ns, outcome result) {
  const double us = std::max<double>(static_cast<double>(elapsed_ns) / 1e3, 1.0);
  const int bucket = std::clamp(static_cast<int>(std::floor(std::log2(us) * 4)), 0, num_buckets - 1);
  std::lock_guard lock(mutex_);
  ++buckets_[bucket];
  ++counters_.num_calls;
  counters_.total_ms += static_cast<double>(elapsed_ns) / 1e6;
  if (result == outcome::rejected) ++counters_.num_rejected;
  if (result == outcome::error || result == outcome::over_budget) ++counters_.num_errors;
  if (result == outcome::over_budget) ++counters_.num_over_budget;
}

plugin_counters plugin_stats::snapshot() const {
  std::lock_guard lock(mutex_);
  plugin_counters out = counters_;
  // A quantile is reported as its bucket's upper edge: at most ~19 % above the true value.
  auto quantile = [&](double q) {
    const auto rank = static_cast<int64_t>(std::ceil(q * static_cast<double>(counters_.num_calls)));
    int64_t seen = 0;
    for (int b = 0; b < num_buckets; ++b) {
      seen += buckets_[b];
      if (seen >= rank && seen > 0) return std::exp2((b + 1) / 4.0) / 1e3;
    }
    return 0.0;
  };
  out.p50_ms = quantile(0.5);
  out.p99_ms = quantile(0.99);
  return out;
}

}  // namespace troupe
