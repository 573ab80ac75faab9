#pragma once
// Goodput: the highest request rate at which at least `target` of the requests meet the SLO.
// Found by search, as DistServe defines and measures it: the rate is doubled (or halved) from
// `start_rate` until one run meets the target and another misses it, then the bracket is
// bisected until it is narrower than `tolerance` (relative) or `max_runs` runs have been spent.

#include <functional>
#include <optional>
#include <vector>

namespace troupe::bench_tool {

struct goodput_search_settings {
  double start_rate = 1.0;
  double target = 0.9;      // share of requests that must meet the SLO
  double tolerance = 0.02;  // stop when (miss - met) / met is below this
  int max_runs = 12;
  double min_rate = 1e-3;  // below this the server meets the target at no rate worth naming
};

struct goodput_probe {
  double rate = 0;
  double attainment = 0;
  bool met = false;
};

struct goodput_result {
  std::optional<double> rate;         // the highest rate found to meet the target
  bool bracketed = false;             // false: no miss was found within max_runs (rate is a lower bound)
  std::vector<goodput_probe> probes;  // every run, in order
};

// run_at: runs the load at a rate and returns the share of its requests that met the SLO.
goodput_result find_goodput(const std::function<double(double rate)>& run_at, const goodput_search_settings& settings);

}  // namespace troupe::bench_tool
