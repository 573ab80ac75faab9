#pragma once
// One plugin's counters on one stage: calls, failures (errors, exceptions, garbage, calls over
// budget), refusals and the time of its calls (p50/p99 from a log-scale histogram). Thread-safe:
// a pool of tokenizers shares a plugin instance.

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace troupe {

struct plugin_counters {
  std::string plugin;  // its name
  std::string hook;    // request | output | logits | route
  int64_t num_calls = 0;
  int64_t num_errors = 0;       // failed requests: error returns, exceptions, garbage results
  int64_t num_over_budget = 0;  // of the errors: calls that took longer than the budget
  int64_t num_rejected = 0;     // requests refused (request hook) or stopped (output hook)
  double p50_ms = 0;
  double p99_ms = 0;
  double total_ms = 0;
};

class plugin_stats {
 public:
  enum class outcome { ok, rejected, error, over_budget };

  void record(int64_t elapsed_ns, outcome result);
  plugin_counters snapshot() const;  // plugin and hook left empty: the caller names them

 private:
  // Bucket b holds calls of [2^(b/4), 2^((b+1)/4)) microseconds: quarter-octaves, 0.5 us to ~1 h.
  static constexpr int num_buckets = 128;
  mutable std::mutex mutex_;
  std::array<int64_t, num_buckets> buckets_{};
  plugin_counters counters_;
};

}  // namespace troupe
