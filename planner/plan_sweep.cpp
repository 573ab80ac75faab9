#include "planner/plan_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

namespace troupe {

latency_summary summarize_latencies(std::vector<double> values) {
  latency_summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  auto quantile = [&](double q) {
    // Linear interpolation between closest ranks, as numpy's default (tools/bench does the same).
    const double position = q * static_cast<double>(values.size() - 1);
    const size_t low = static_cast<size_t>(std::floor(position));
    const size_t high = std::min(values.size() - 1, low + 1);
    return values[low] + (values[high] - values[low]) * (position - static_cast<double>(low));
  };
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.median = quantile(0.5);
  s.p90 = quantile(0.9);
  s.p99 = quantile(0.99);
  return s;
}

plan_row summarize_simulation(const std::string& topology, double rate, const std::vector<planned_request>& workload,
                              const simulation_result& result, const service_level& slo) {
  plan_row row;
  row.topology = topology;
  row.rate = rate;
  row.num_requests = static_cast<int>(result.requests.size());
  std::vector<double> ttft, tpot, itl, e2e;
  for (size_t i = 0; i < result.requests.size(); ++i) {
    const simulated_outcome& r = result.requests[i];
    if (!r.ok()) continue;
    ++row.num_completed;
    row.input_tokens += workload[i].prompt_len;
    row.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft());
    e2e.push_back(r.finish_s - r.arrival_s);
    if (r.output_tokens > 1) {
      tpot.push_back(r.tpot());
      itl.insert(itl.end(), r.token_gaps_s.begin(), r.token_gaps_s.end());
    }
  }
  row.ttft = summarize_latencies(std::move(ttft));
  row.tpot = summarize_latencies(std::move(tpot));
  row.itl = summarize_latencies(std::move(itl));
  row.e2e = summarize_latencies(std::move(e2e));
  const double first = workload.empty() ? 0 : workload.front().arrival_s;
  row.duration_s = std::max(0.0, result.end_s - first);
  row.attainment = result.attainment(slo);
  row.goodput = rate * row.attainment;
  return row;
}

std::vector<plan_choice> rank_topologies(const std::vector<plan_row>& rows, double target) {
  std::vector<plan_choice> ranking;
  std::map<std::string, size_t> index;
  for (const plan_row& row : rows) {
    auto [it, added] = index.emplace(row.topology, ranking.size());
    if (added) ranking.push_back(plan_choice{row.topology, 0, 0});
    plan_choice& choice = ranking[it->second];
    if (row.attainment >= target) choice.max_rate = std::max(choice.max_rate, row.rate);
    choice.best_goodput = std::max(choice.best_goodput, row.goodput);
  }
  std::stable_sort(ranking.begin(), ranking.end(), [](const plan_choice& a, const plan_choice& b) {
    return a.max_rate != b.max_rate ? a.max_rate > b.max_rate : a.best_goodput > b.best_goodput;
  });
  return ranking;
}

std::string format_plan(const std::vector<plan_row>& rows, const std::vector<plan_choice>& ranking, double target) {
  std::string out = fmt::format("{:<28} {:>8} {:>10} {:>10} {:>11} {:>11} {:>11} {:>11}\n", "topology", "rate",
                                "SLO met", "goodput", "TTFT mean", "TTFT p90", "TPOT mean", "TPOT p99");
  for (const plan_row& r : rows) {
    out += fmt::format("{:<28} {:>8.3g} {:>9.1f}% {:>10.3g} {:>9.1f}ms {:>9.1f}ms {:>9.2f}ms {:>9.2f}ms\n", r.topology,
                       r.rate, 100 * r.attainment, r.goodput, 1e3 * r.ttft.mean, 1e3 * r.ttft.p90, 1e3 * r.tpot.mean,
                       1e3 * r.tpot.p99);
  }
  out += fmt::format("\nHighest rate holding the SLO for {:.0f}% of requests:\n", 100 * target);
  for (const plan_choice& c : ranking) {
    out += fmt::format("  {:<28} {}\n", c.topology,
                       c.max_rate > 0 ? fmt::format("{:.3g} req/s", c.max_rate) : std::string("none of the rates"));
  }
  if (!ranking.empty() && ranking.front().max_rate > 0) {
    out += fmt::format("Recommended: {}\n", ranking.front().topology);
  } else {
    out += "Recommended: none: no topology holds the SLO at any simulated rate (try lower rates)\n";
  }
  return out;
}

std::string plan_sweep_csv(const std::vector<plan_row>& rows) {
  std::ostringstream out;
  out << "rate,round,offered_rate,concurrency,completed,errors,duration_s,request_throughput,input_throughput,"
         "output_throughput";
  for (const char* m : {"ttft", "tpot", "itl", "e2e"}) {
    out << ',' << m << "_mean_ms," << m << "_median_ms," << m << "_p90_ms," << m << "_p99_ms";
  }
  out << ",slo_attainment,goodput_rate\n";
  auto number = [](double v) { return fmt::format("{:.6g}", v); };
  for (const plan_row& r : rows) {
    const double duration = r.duration_s > 0 ? r.duration_s : 1;
    out << number(r.rate) << ",0," << number(r.rate) << ",0," << r.num_completed << ','
        << (r.num_requests - r.num_completed) << ',' << number(r.duration_s) << ','
        << number(r.num_completed / duration) << ',' << number(static_cast<double>(r.input_tokens) / duration) << ','
        << number(static_cast<double>(r.output_tokens) / duration);
    for (const latency_summary* s : {&r.ttft, &r.tpot, &r.itl, &r.e2e}) {
      out << ',' << number(1e3 * s->mean) << ',' << number(1e3 * s->median) << ',' << number(1e3 * s->p90) << ','
          << number(1e3 * s->p99);
    }
    out << ',' << number(r.attainment) << ",\n";
  }
  return out.str();
}

}  // namespace troupe
