// The planner's workloads and table: draws are deterministic and at their rate, a recorded bench
// run is read back and rescaled, and the ranking picks the topology that holds the SLO longest.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "planner/plan_sweep.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

TEST(planned_workload, draws_are_deterministic_and_arrive_at_the_rate) {
  std::vector<request_class> mix{{0.8, {64}, {32}}, {0.2, {1024}, {32}}};
  const auto a = draw_workload(mix, 2000, 5.0, 1.0, 3);
  const auto b = draw_workload(mix, 2000, 5.0, 1.0, 3);
  ASSERT_EQ(a.size(), 2000u);
  int longs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    longs += a[i].prompt_len == 1024;
  }
  EXPECT_NEAR(a.back().arrival_s / 1999.0, 0.2, 0.02);  // mean gap 1 / rate
  EXPECT_NEAR(longs / 2000.0, 0.2, 0.03);
  EXPECT_THROW(draw_workload(mix, 0, 5.0, 1.0, 3), std::invalid_argument);
  EXPECT_THROW(draw_workload(mix, 10, 0.0, 1.0, 3), std::invalid_argument);
  EXPECT_THROW(draw_workload({{0.0, {8}, {8}}}, 10, 1.0, 1.0, 3), std::invalid_argument);
}

TEST(planned_workload, lengths_follow_their_distribution) {
  std::vector<request_class> mix{{1.0, {100, planned_length_distribution::uniform, 0.5}, {10}}};
  int lowest = 1 << 30, highest = 0;
  for (const planned_request& r : draw_workload(mix, 500, 1.0, 1.0, 1)) {
    lowest = std::min(lowest, r.prompt_len);
    highest = std::max(highest, r.prompt_len);
  }
  EXPECT_GE(lowest, 50);
  EXPECT_LE(highest, 150);
  EXPECT_LT(lowest, 60);
  EXPECT_GT(highest, 140);
  EXPECT_THROW(parse_planned_length_distribution("normalish"), std::invalid_argument);
}

TEST(planned_workload, a_bench_run_is_read_back_in_order_and_rescaled) {
  testing::scratch_dir dir;
  const std::string path = (dir / "run.json").string();
  // The keys tools/bench --json writes (tools/bench_tool/run_summary.cpp).
  std::ofstream(path) << R"({"summary": {}, "requests": [
      {"ok": true, "start_s": 0.5, "prompt_tokens": 30, "output_tokens": 4},
      {"ok": true, "start_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}]})";
  const auto run = load_bench_run(path);
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0].prompt_len, 10);
  EXPECT_EQ(run[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ(at_rate(run, 2.0, 4.0)[1].arrival_s, 0.25);
  std::ofstream(path) << R"({"requests": [{"ok": false, "start_s": 0.0, "prompt_tokens": 0, "output_tokens": 0}]})";
  EXPECT_THROW(load_bench_run(path), std::runtime_error);
  std::ofstream(path) << R"({"summary": {}})";
  EXPECT_THROW(load_bench_run(path), std::runtime_error);
  EXPECT_THROW(load_bench_run((dir / "missing.json").string()), std::runtime_error);
}

TEST(planned_workload, a_bench_runs_own_cpu_per_request_is_read_when_it_was_recorded) {
  testing::scratch_dir dir;
  const std::string path = (dir / "run.json").string();
  // tools/bench --json writes the summary's client_cpu_seconds and num_requests.
  std::ofstream(path) << R"({"summary": {"num_requests": 4, "client_cpu_seconds": 0.02}, "requests": []})";
  EXPECT_DOUBLE_EQ(bench_run_client_cpu_per_request(path), 0.005);
  std::ofstream(path) << R"({"summary": {"num_requests": 4}})";  // an older bench: not recorded
  EXPECT_EQ(bench_run_client_cpu_per_request(path), 0);
  std::ofstream(path) << R"({"summary": {"num_requests": 4, "client_cpu_seconds": "a lot"}})";
  try {
    bench_run_client_cpu_per_request(path);
    ADD_FAILURE() << "a CPU time that is not a number was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("client_cpu_seconds"), std::string::npos) << e.what();
  }
}

TEST(plan_sweep, the_ranking_prefers_the_topology_that_holds_the_slo_at_the_highest_rate) {
  std::vector<plan_row> rows;
  auto row = [&](const char* topology, double rate, double attainment) {
    plan_row r;
    r.topology = topology;
    r.rate = rate;
    r.attainment = attainment;
    r.goodput = rate * attainment;
    rows.push_back(r);
  };
  row("colocated x2", 1, 1.0);
  row("colocated x2", 2, 0.95);
  row("colocated x2", 4, 0.5);
  row("1P1D", 1, 1.0);
  row("1P1D", 2, 0.99);
  row("1P1D", 4, 0.92);
  const auto ranking = rank_topologies(rows, 0.9);
  ASSERT_EQ(ranking.size(), 2u);
  EXPECT_EQ(ranking[0].topology, "1P1D");
  EXPECT_EQ(ranking[0].max_rate, 4);
  EXPECT_EQ(ranking[1].max_rate, 2);
  EXPECT_NE(format_plan(rows, ranking, 0.9).find("Recommended: 1P1D"), std::string::npos);
  // The bench's sweep.csv: its header's 28 columns, one row per rate.
  const std::string csv = plan_sweep_csv(rows);
  const std::string header = csv.substr(0, csv.find('\n'));
  EXPECT_EQ(std::count(header.begin(), header.end(), ','), 27);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);
}

TEST(plan_sweep, latency_quantiles_interpolate_between_ranks) {
  const latency_summary s = summarize_latencies({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_NEAR(s.p90, 3.7, 1e-12);
  EXPECT_EQ(summarize_latencies({}).p99, 0);
}

}  // namespace
}  // namespace troupe
