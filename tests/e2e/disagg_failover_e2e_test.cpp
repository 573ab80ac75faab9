// kill -9 of a prefill node, and of a decode node, at random moments while a 1P1D topology
// serves (nodes started by the test, so it can kill one and start it again on its address).
// Every request of a trial completes with the output of an undisturbed colocated server, each
// streamed token reaches the client once, and when idle no survivor holds a KV block, a
// reservation or an open transfer. While the prefill node is down the decode node computes
// prefills itself; while the decode node is down the prefill node serves whole requests; the
// killed node, started again, takes its role back without a restart of the controller.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// Long enough (60-90 tokens, 16-token chunks) that eight of them keep the prefill node busy for a
// good part of the kill window: a prefill kill must meet prefills in flight, not only idle nodes.
const std::vector<std::string> prompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, "
    "she saw a big red ball in the park. She ran to it and kicked it very high. The ball flew over the tree",
    "The little dog ran to the park. He saw a cat on the fence and barked at it. The cat jumped down and "
    "ran away. The dog was happy and wagged his tail. Then he saw his friend the bird in the sky",
    "Lily and Tom went to the park. They saw a big tree with a swing. Tom wanted to swing first, but Lily "
    "said it was her turn. They argued for a while, then they decided to share and take turns",
    "One day, a bird flew into the house through the open window. Mom was surprised and the children "
    "laughed. The bird sat on the table and looked at the cake. It was a big chocolate cake"};

class disagg_failover_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(credentials(), {"controller", "prefill-a", "decode-a"});
    topology_spec colocated;
    reference_.emplace(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                       dir_ / "colocated.log");
    nodes_.emplace_back(credentials(), "prefill-a", free_port(), dir_.path());
    nodes_.emplace_back(credentials(), "decode-a", free_port(), dir_.path());
    topology_spec pair;
    pair.credentials = credentials();
    pair.nodes = {nodes_[0].entry(), nodes_[1].entry()};
    pair.engines = {};
    pair.prefill = {"prefill-a"};
    pair.decode = {"decode-a"};
    pair.max_num_batched_tokens = 16;  // prompts stream out in chunks: a kill lands mid-transfer more often
    pair.kv_transfer_timeout_ms = 5000;
    pair.connect_timeout_ms = 2000;  // each try on a node still down waits this long
    controller_.emplace(controller_process::kind::serve, pair.write(dir_ / "disagg-1p1d.toml"),
                        dir_ / "controller.log");
  }

  fs::path credentials() const { return dir_ / "certs"; }

  // Starts `node` again and waits (bounded) until the controller has its instance back.
  void restart(node_process& node, const std::string& role) {
    const std::string back = role + " on node " + node.name() + " is back";
    const int before = count_of(controller_->log(), back);
    node.start();
    ASSERT_TRUE(controller_->wait_for_log(back, before + 1, 30s)) << node.name() << " not back:\n"
                                                                  << controller_->log();
  }

  void kill_trials(node_process& victim, const std::string& role) {
    const uint64_t seed = failover_seed("disagg_failover_e2e (" + role + ")");
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));

    const std::vector<mixed_request> mix = request_mix(8, prompts, 60, 160, true, 7);
    const std::vector<outcome> expected = reference_outcomes(*reference_, mix);
    ASSERT_FALSE(HasFailure());

    for (int trial = 0; trial < 20; ++trial) {
      SCOPED_TRACE("trial " + std::to_string(trial));
      // Prefills end early in a request's life: the prefill node is killed within their window.
      const auto kill_after = std::chrono::milliseconds(rng() % (role == "prefill" ? 40 : 120));
      std::vector<outcome> got(mix.size());
      auto threads = send_together(*controller_, mix, 0, mix.size(), got, 40s);
      std::this_thread::sleep_for(kill_after);
      victim.kill9();
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < mix.size(); ++i) {
        EXPECT_TRUE(same_output(got[i], expected[i]))
            << "request " << i << " after killing " << victim.name() << " at " << kill_after.count()
            << " ms: " << got[i] << " != " << expected[i];
      }
      expect_nothing_held(*controller_);
      restart(victim, role);
      if (HasFailure()) break;  // one trial's failure, with its log, not twenty
    }
    const std::string log = controller_->log();
    static const std::regex rerun(R"(re-running its ([0-9]+) requests)");
    const int num_rerun = sum_of(log, rerun);
    EXPECT_GT(num_rerun, 10) << "the kills hardly met a request in flight:\n" << log;
    std::printf("disagg_failover_e2e: %d requests re-run after 20 kills of the %s node\n", num_rerun, role.c_str());
    if (HasFailure()) ADD_FAILURE() << "controller log:\n" << log;
  }

  scratch_dir dir_;
  std::optional<controller_process> reference_;
  std::deque<node_process> nodes_;  // before controller_, which stops first
  std::optional<controller_process> controller_;
};

TEST_F(disagg_failover_e2e, twenty_kills_of_the_prefill_node_lose_no_request_token_or_lease) {
  kill_trials(nodes_[0], "prefill");
}

TEST_F(disagg_failover_e2e, twenty_kills_of_the_decode_node_lose_no_request_token_or_lease) {
  kill_trials(nodes_[1], "decode");
}

}  // namespace
}  // namespace troupe::test::cluster
