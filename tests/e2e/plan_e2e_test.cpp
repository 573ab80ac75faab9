// `troupe plan` as a user runs it: calibrated on the stories260K model itself, over a mix of short
// and long requests, it prints a row per topology and rate and a recommendation, writes each
// topology's rows as a bench sweep.csv, and names what is wrong with its flags.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/e2e/e2e_support.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

const std::string stories_gguf = (stories_root / "gguf" / "stories260K-f32.gguf").string();

TEST(plan_e2e, a_calibrated_plan_ranks_every_topology_and_writes_their_sweeps) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  TROUPE_REQUIRE_SHARED_MODEL(stories_gguf);
  testing::scratch_dir out;
  const run_result r = run_troupe("plan --calibrate " + shell_quote(stories_gguf) +
                                  " --threads 1 --kv-memory-mb 16 --mix 0.8:64:16 --mix 0.2:256:16 --rates 5,500 "
                                  "--num-prompts 60 --workers 2 --budgets 128,512 --slo ttft=500ms,tpot=100ms --out " +
                                  shell_quote(out.path().string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("calibrated on"), std::string::npos) << r.err;
  for (const char* topology :
       {"colocated x2, budget 128", "colocated x2, budget 512", "1P1D, budget 128", "1P1D, budget 512"}) {
    EXPECT_NE(r.out.find(topology), std::string::npos) << topology << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("Recommended: "), std::string::npos) << r.out;
  // At 5 req/s the tiny model holds a generous SLO whatever the topology.
  EXPECT_EQ(r.out.find("Recommended: none"), std::string::npos) << r.out;
  const std::string csv = read_file(out.path() / "1P1D-budget-128" / "sweep.csv");
  EXPECT_EQ(csv.rfind("rate,round,offered_rate", 0), 0u) << csv;
  // The bench draws the plan's plots from it.
  const std::filesystem::path bench = std::filesystem::path(TROUPE_BINARY_DIR) / "bin" / "troupe-bench";
  if (std::filesystem::exists(bench)) {
    const std::string dir = (out.path() / "1P1D-budget-128").string();
    const run_result plot = run_command(shell_quote(bench.string()) + " --replot " + shell_quote(dir + "/sweep.csv") +
                                        " --out " + shell_quote(dir));
    EXPECT_EQ(plot.exit_code, 0) << plot.err;
    EXPECT_TRUE(std::filesystem::exists(out.path() / "1P1D-budget-128" / "slo_attainment_vs_rate.svg"));
  }
}

TEST(plan_e2e, on_shared_cores_the_serving_stacks_cpu_can_bound_the_rate) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  // 1 ms steps hold 50 req/s easily; a stack that spends 40 ms of CPU on each request cannot.
  const std::string plan =
      "plan --step-model 0.001,0,0,0,0 --num-kv-blocks 400 --input-len 16 --output-len 4 --num-prompts 100 --rates 50 "
      "--slo ttft=200ms,tpot=100ms";
  const run_result free_stack = run_troupe(plan);
  ASSERT_EQ(free_stack.exit_code, 0) << free_stack.err;
  EXPECT_NE(free_stack.out.find("100.0%"), std::string::npos) << free_stack.out;
  const run_result costly_stack = run_troupe(plan + " --cores 2 --stack-ms-per-request 40 --stack-ms-per-token 0");
  ASSERT_EQ(costly_stack.exit_code, 0) << costly_stack.err;
  EXPECT_NE(costly_stack.out.find("shared cores: 2"), std::string::npos) << costly_stack.out;
  EXPECT_EQ(costly_stack.out.find("100.0%"), std::string::npos) << costly_stack.out;
  // The plan's model as flags gives the same plan again.
  const size_t flags_at = free_stack.out.find("as flags: ");
  ASSERT_NE(flags_at, std::string::npos) << free_stack.out;
  const std::string flags = free_stack.out.substr(flags_at + 10, free_stack.out.find('\n', flags_at) - flags_at - 10);
  const run_result again = run_troupe(
      "plan " + flags + " --input-len 16 --output-len 4 --num-prompts 100 --rates 50 --slo ttft=200ms,tpot=100ms");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, free_stack.out);
  const run_result negative = run_troupe(plan + " --cores 2 --stack-ms-per-token -1 --stack-ms-per-request -2");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.err.find("CPU costs must be finite, 0 or more"), std::string::npos) << negative.err;
}

TEST(plan_e2e, flags_that_cannot_make_a_plan_are_named) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  const run_result none = run_troupe("plan --rates 1 --num-kv-blocks 100");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("--calibrate MODEL, --metrics-url URL or --step-model"), std::string::npos) << none.err;
  const run_result three = run_troupe("plan --step-model 0.001,0.0001 --rates 1 --num-kv-blocks 100");
  EXPECT_NE(three.exit_code, 0);
  EXPECT_NE(three.err.find("--step-model takes 5 numbers"), std::string::npos) << three.err;
  const run_result slo =
      run_troupe("plan --step-model 0.001,0.0001,0,0,0 --rates 1 --num-kv-blocks 100 --slo ttft=fast");
  EXPECT_NE(slo.exit_code, 0);
  EXPECT_NE(slo.err.find("ttft 'fast'"), std::string::npos) << slo.err;
  const run_result mix = run_troupe("plan --step-model 0.001,0.0001,0,0,0 --rates 1 --num-kv-blocks 100 --mix 0.8:64");
  EXPECT_NE(mix.exit_code, 0);
  EXPECT_NE(mix.err.find("SHARE:INPUT_LEN:OUTPUT_LEN"), std::string::npos) << mix.err;
  const run_result floor = run_troupe("plan --step-model 0.001,0.0001,0,0,0,0.5 --rates 1 --num-kv-blocks 100");
  EXPECT_NE(floor.exit_code, 0);
  EXPECT_NE(floor.err.find("token floor must be at least 1"), std::string::npos) << floor.err;
  const run_result given = run_troupe("plan --step-model 0.001,0.0001,0,0,0 --rates 1,2 --num-kv-blocks 100");
  EXPECT_EQ(given.exit_code, 0) << given.err;
  EXPECT_NE(given.out.find("colocated x1, budget 2048"), std::string::npos) << given.out;
}

}  // namespace
}  // namespace troupe::test
