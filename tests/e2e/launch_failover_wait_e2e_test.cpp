// [cluster] failover_wait_ms under `troupe launch`: a topology whose only engine runs on one
// node, and which names no credentials (launch makes its private CA under XDG_STATE_HOME).
// kill -9 of that node under streaming load: launch restarts it, the controller places the
// engine on it again, and the streams that waited meanwhile complete with the output of an
// undisturbed colocated server, each token once. With the node never restarted, the requests
// fail by cause once the bound has passed (HTTP 503, ZeroMQ `unavailable`), not before.

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day, a bird"};

class launch_failover_wait_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    // launch keeps its private CA under $XDG_STATE_HOME: the test's own directory, not the user's.
    const char* before = std::getenv("XDG_STATE_HOME");
    if (before) saved_state_home_ = before;
    ::setenv("XDG_STATE_HOME", (dir_.path() / "state").c_str(), 1);
    // The reference: a colocated server of the same model and settings (an f32 KV cache, as in
    // cluster_failover_e2e: a re-run recomputes the streamed tokens as a prompt).
    topology_spec colocated;
    colocated.kv_cache_dtype = "f32";
    reference_.emplace(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                       dir_ / "colocated.log");
  }

  void TearDown() override {
    if (saved_state_home_) {
      ::setenv("XDG_STATE_HOME", saved_state_home_->c_str(), 1);
    } else {
      ::unsetenv("XDG_STATE_HOME");
    }
  }

  // One node, the only engine on it, no [cluster] credentials.
  fs::path write_topology(const std::string& restart, int failover_wait_ms) const {
    const fs::path path = dir_ / ("one-engine-" + restart + ".toml");
    std::ofstream(path) << "[model]\npath = \"" << stories_dir << "\"\nload_format = \"auto\"\n"
                        << "[node]\nthreads = 1\nkv_cache_dtype = \"f32\"\n"
                        << "[http]\nenabled = true\nhost = \"127.0.0.1\"\nport = 0\n"
                        << "[scheduler]\nmax_num_batched_tokens = 2048\nmax_num_seqs = 64\nkv_memory_mb = 32\n"
                        << "[cluster]\nname = \"controller\"\nconnect_timeout_ms = 2000\nreconnect_interval_ms = 200\n"
                        << "failover_wait_ms = " << failover_wait_ms << "\n"
                        << "[[nodes]]\nname = \"engine-a\"\naddress = \"127.0.0.1:" << free_port() << "\"\nrestart = \""
                        << restart << "\"\n"
                        << "[placement]\nengines = [\"engine-a\"]\n";
    return path;
  }

  scratch_dir dir_;
  std::optional<std::string> saved_state_home_;
  std::optional<controller_process> reference_;
};

TEST_F(launch_failover_wait_e2e, the_only_engine_node_killed_its_streams_wait_for_the_restart_and_lose_no_token) {
  // Long enough that the kill (at most 100 ms in) always meets them running: 200 tokens took
  // about 130 ms on a quiet CI machine, and a kill after the last had ended tested nothing.
  const std::vector<mixed_request> mix = request_mix(8, prompts, 350, 450, true, 11);
  const std::vector<outcome> expected = reference_outcomes(*reference_, mix);
  ASSERT_FALSE(HasFailure());

  controller_process launch(controller_process::kind::launch, write_topology("on-failure", 60000), dir_ / "launch.log");
  // No credentials named, every member here: launch made its private CA and says where.
  EXPECT_NE(launch.log().find("made a private CA and certificates for 2 members in "), std::string::npos)
      << launch.log();
  const fs::path state = dir_ / "state" / "troupe" / "launch";
  ASSERT_TRUE(fs::exists(state)) << launch.log();
  int num_cas = 0;
  for (const auto& entry : fs::directory_iterator(state))
    num_cas += fs::exists(entry.path() / "credentials" / "ca.crt");
  EXPECT_EQ(num_cas, 1);

  const uint64_t seed = failover_seed("launch_failover_wait_e2e");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int num_trials = 3;
  for (int trial = 0; trial < num_trials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const auto pids = launch.launched_pids();
    ASSERT_EQ(pids.count("engine-a"), 1u) << launch.log();
    const auto kill_after = std::chrono::milliseconds(20 + rng() % 80);
    std::vector<outcome> got(mix.size());
    auto threads = send_together(launch, mix, 0, mix.size(), got, 90s);
    std::this_thread::sleep_for(kill_after);
    ASSERT_EQ(::kill(pids.at("engine-a"), SIGKILL), 0);
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < mix.size(); ++i) {
      EXPECT_TRUE(same_output(got[i], expected[i]))
          << "request " << i << " killed at " << kill_after.count() << " ms: " << got[i] << " != " << expected[i];
    }
    // The kill met requests in flight, they waited, and they ran on the restarted node.
    EXPECT_TRUE(launch.wait_for_log("for an engine instance to come back", trial + 1, 5s)) << launch.log();
    EXPECT_TRUE(launch.wait_for_log("that waited for an engine instance run on instance", trial + 1, 5s))
        << launch.log();
    expect_nothing_held(launch);
    if (HasFailure()) break;
  }
  if (HasFailure()) ADD_FAILURE() << "launch log:\n" << launch.log();
}

TEST_F(launch_failover_wait_e2e, with_the_node_never_restarted_requests_fail_by_cause_once_the_bound_has_passed) {
  const std::vector<mixed_request> mix = request_mix(4, prompts, 200, 250, true, 5);
  constexpr auto bound = std::chrono::milliseconds(2000);
  controller_process launch(controller_process::kind::launch, write_topology("never", bound.count()),
                            dir_ / "launch.log");
  const auto pids = launch.launched_pids();
  ASSERT_EQ(pids.count("engine-a"), 1u) << launch.log();
  std::vector<outcome> got(mix.size());
  auto threads = send_together(launch, mix, 0, mix.size(), got, 30s);
  std::this_thread::sleep_for(50ms);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pids.at("engine-a"), SIGKILL), 0);
  for (auto& t : threads) t.join();
  const auto waited = std::chrono::steady_clock::now() - killed;
  int num_failed = 0;
  for (const outcome& o : got) {
    if (o.error.empty()) continue;  // finished before the kill
    ++num_failed;
    EXPECT_NE(o.error.find("no engine instance is available"), std::string::npos) << o;
  }
  EXPECT_GT(num_failed, 0) << "the kill came after every request finished";
  EXPECT_GE(waited, bound) << "they failed before the bound";
  EXPECT_LT(waited, bound + 10s) << "they waited far past the bound";

  // A new request waits too, then fails with the cause: HTTP 503 and ZeroMQ `unavailable`.
  for (bool http : {false, true}) {
    mixed_request late = mix[0];
    late.http = http;
    const auto sent = std::chrono::steady_clock::now();
    const outcome o = run_one(launch, late, 30s);
    EXPECT_GE(std::chrono::steady_clock::now() - sent, bound - 100ms) << o;
    EXPECT_NE(o.error.find("within failover_wait_ms (2000 ms)"), std::string::npos) << o;
    EXPECT_EQ(o.error.rfind(http ? "HTTP 503: " : "unavailable: ", 0), 0u) << o;
  }
  if (HasFailure()) ADD_FAILURE() << "launch log:\n" << launch.log();
}

}  // namespace
}  // namespace troupe::test::cluster
