#pragma once
// `troupe plan`'s table: each candidate topology simulated at each request rate, summarized the
// way tools/bench summarizes a measured run (so the two can be set side by side, and the bench's
// --replot draws a plan's curves), and the choice: the topology that holds the SLO at the highest
// rate.

#include <string>
#include <vector>

#include "planner/cluster_simulation.hpp"

namespace troupe {

struct latency_summary {
  double mean = 0, median = 0, p90 = 0, p99 = 0;  // seconds
};
// Of `values` (any order); zeros with none.
latency_summary summarize_latencies(std::vector<double> values);

struct plan_row {
  std::string topology;  // simulated_cluster::name()
  double rate = 0;       // requests per second offered
  int num_requests = 0;
  int num_completed = 0;
  double duration_s = 0;  // first arrival to last end
  int64_t input_tokens = 0, output_tokens = 0;
  latency_summary ttft, tpot, itl, e2e;
  double attainment = 0;  // share of requests meeting the SLO
  double goodput = 0;     // requests per second meeting it: rate x attainment
};

plan_row summarize_simulation(const std::string& topology, double rate, const std::vector<planned_request>& workload,
                              const simulation_result& result, const service_level& slo);

struct plan_choice {
  std::string topology;
  double max_rate = 0;      // the highest rate simulated at which attainment >= target; 0: none
  double best_goodput = 0;  // the highest goodput over every rate
};
// One per topology, best first (highest max_rate, then goodput).
std::vector<plan_choice> rank_topologies(const std::vector<plan_row>& rows, double target);

// The table a person reads: a row per topology and rate, then the ranking and the recommendation.
std::string format_plan(const std::vector<plan_row>& rows, const std::vector<plan_choice>& ranking, double target);

// One topology's rows as a sweep.csv of tools/bench (key "rate", round 0): `tools/bench --replot`
// draws its plots.
std::string plan_sweep_csv(const std::vector<plan_row>& rows);

}  // namespace troupe
