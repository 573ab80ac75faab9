#include "tools/bench_tool/goodput_search.hpp"

#include <stdexcept>
#include <string>

namespace troupe::bench_tool {

goodput_result find_goodput(const std::function<double(double rate)>& run_at, const goodput_search_settings& s) {
  if (!(s.start_rate > 0)) throw std::invalid_argument("--goodput-start-rate must be above 0");
  if (s.max_runs < 2) throw std::invalid_argument("--goodput-max-runs must be at least 2");
  goodput_result result;
  auto probe = [&](double rate) {
    const double attainment = run_at(rate);
    result.probes.push_back({rate, attainment, attainment >= s.target});
    return result.probes.back().met;
  };
  std::optional<double> met, missed;
  double rate = s.start_rate;
  // Bracket: double while the target holds, halve while it does not.
  while (static_cast<int>(result.probes.size()) < s.max_runs && (!met || !missed)) {
    if (probe(rate)) {
      met = rate;
      rate *= 2;
    } else {
      missed = rate;
      if (rate / 2 < s.min_rate) break;
      rate /= 2;
    }
  }
  // Bisect.
  while (met && missed && static_cast<int>(result.probes.size()) < s.max_runs &&
         (*missed - *met) / *met > s.tolerance) {
    const double mid = (*met + *missed) / 2;
    if (probe(mid)) {
      met = mid;
    } else {
      missed = mid;
    }
  }
  result.rate = met;
  result.bracketed = met && missed;
  return result;
}

}  // namespace troupe::bench_tool
