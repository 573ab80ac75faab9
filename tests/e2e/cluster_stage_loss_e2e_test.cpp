// kill -9 of a split-stages cluster's tokenizer or detokenizer node while 16 greedy streams run
// (`troupe serve --config`, nodes started by the test): the lost stage is placed on the
// controller at once and no request notices. A request the lost tokenizer had passed on goes on;
// one it had not is tokenized again; a request whose detokenizer was lost is resumed by the new
// one from the tokens its client has. Every stream completes with the output of an undisturbed
// colocated server (the same text and token ids: no token lost or sent twice), /health stays
// 200, every KV block is free after, and the killed node is never started again.

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

const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day, a bird"};

// 16 greedy streams, half over ZeroMQ and half over HTTP.
std::vector<mixed_request> greedy_streams() {
  std::vector<mixed_request> mix = request_mix(16, prompts, 120, 240, true, 17);
  for (mixed_request& m : mix) {
    m.request.sampling.temperature = 0.0f;
    m.request.stream = true;
  }
  return mix;
}

class cluster_stage_loss_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(credentials(), {"controller", "tokenizers", "engine", "detokenizer"});
    topology_spec colocated;
    controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                                 dir_ / "colocated.log");
    mix_ = greedy_streams();
    expected_.resize(mix_.size());
    auto threads = send_together(reference, mix_, 0, mix_.size(), expected_);
    for (auto& t : threads) t.join();
    for (const outcome& o : expected_) ASSERT_EQ(o.error, "") << "reference: " << o;
  }

  fs::path credentials() const { return dir_ / "certs"; }

  // A fresh split-stages cluster: the tokenizers, the engine and the detokenizer each on a node.
  void start_cluster(int attempt) {
    controller_.reset();
    nodes_.clear();
    for (const char* name : {"tokenizers", "engine", "detokenizer"}) {
      nodes_.emplace_back(credentials(), name, free_port(), dir_.path());
    }
    topology_spec split;
    split.credentials = credentials();
    split.nodes = {nodes_[0].entry(), nodes_[1].entry(), nodes_[2].entry()};
    split.tokenizers = {"tokenizers"};
    split.engines = {"engine"};
    split.detokenizers = {"detokenizer"};
    const std::string name = "split-stages-" + std::to_string(attempt);
    controller_.emplace(controller_process::kind::serve, split.write(dir_ / (name + ".toml")), dir_ / (name + ".log"));
  }

  int health() const {
    httplib::Client c("127.0.0.1", controller_->http_port());
    c.set_read_timeout(5, 0);
    auto res = c.Get("/health");
    return res ? res->status : -1;
  }

  // `trials` times: a fresh cluster, the 16 streams, and kill -9 of the nodes `victims` (indices
  // into nodes_) at a random moment while they run (early for a tokenizer: while requests are
  // still being tokenized). Returns the controller logs, joined.
  // The kill comes between `earliest` and `latest` ms after the streams start.
  std::string kill_mid_stream(const std::vector<size_t>& victims, const std::string& stage, int trials, int earliest,
                              int latest) {
    const uint64_t seed = failover_seed("cluster_stage_loss_e2e");
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::string logs;
    for (int trial = 0; trial < trials; ++trial) {
      SCOPED_TRACE("trial " + std::to_string(trial));
      start_cluster(trial);
      const auto kill_after =
          std::chrono::milliseconds(earliest + static_cast<int>(rng() % static_cast<uint64_t>(latest - earliest + 1)));
      std::vector<outcome> got(mix_.size());
      auto threads = send_together(*controller_, mix_, 0, mix_.size(), got, 60s);
      std::this_thread::sleep_for(kill_after);
      for (size_t victim : victims) nodes_[victim].kill9();
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < mix_.size(); ++i) {
        EXPECT_TRUE(same_output(got[i], expected_[i])) << "request " << i << " after kill -9 at " << kill_after.count()
                                                       << " ms: " << got[i] << " != " << expected_[i];
      }
      for (size_t victim : victims) {
        EXPECT_TRUE(controller_->wait_for_log(
            stage + " stage of node " + nodes_[victim].name() + " now runs on controller", 1, 20s))
            << controller_->log();
      }
      // The stage is back, on the controller: the cluster serves, /health says so, nothing held.
      EXPECT_EQ(health(), 200);
      const std::vector<outcome> after = run_in_waves(*controller_, mix_, mix_.size());
      for (size_t i = 0; i < mix_.size(); ++i)
        EXPECT_TRUE(same_output(after[i], expected_[i])) << "after: " << after[i];
      expect_nothing_held(*controller_);
      const std::string log = controller_->log();
      EXPECT_EQ(log.find("failed 0 requests"), std::string::npos) << log;
      logs += log;
      if (HasFailure()) {
        ADD_FAILURE() << "controller log:\n" << log;
        break;
      }
    }
    return logs;
  }

  scratch_dir dir_;
  std::deque<node_process> nodes_;  // before controller_, which stops first
  std::optional<controller_process> controller_;
  std::vector<mixed_request> mix_;
  std::vector<outcome> expected_;
};

TEST_F(cluster_stage_loss_e2e, a_tokenizer_node_killed_mid_stream_loses_no_request) {
  const std::string logs = kill_mid_stream({0}, "tokenizer", 4, 0, 40);
  static const std::regex again(R"(tokenized again ([0-9]+) requests)");
  std::printf("cluster_stage_loss_e2e: %d requests tokenized again after 4 kills\n", sum_of(logs, again));
}

TEST_F(cluster_stage_loss_e2e, a_detokenizer_node_killed_mid_stream_loses_no_token) {
  const std::string logs = kill_mid_stream({2}, "detokenizer", 4, 20, 220);
  // The kills met streams under way: their text went on from the new detokenizer.
  static const std::regex resumed(R"(([0-9]+) requests resumed there)");
  const int num_resumed = sum_of(logs, resumed);
  EXPECT_GT(num_resumed, 0) << "no kill met a stream in flight:\n" << logs;
  std::printf("cluster_stage_loss_e2e: %d requests resumed after 4 kills\n", num_resumed);
}

TEST_F(cluster_stage_loss_e2e, the_tokenizer_and_detokenizer_nodes_killed_together_lose_nothing) {
  kill_mid_stream({0, 2}, "", 2, 0, 150);
}

}  // namespace
}  // namespace troupe::test::cluster
