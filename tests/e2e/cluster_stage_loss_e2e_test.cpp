// A split-stages cluster whose tokenizer or detokenizer node is killed (kill -9): those stages
// hold state no one else has (a prompt half tokenized, a request's text), so the requests in
// flight and new ones fail with a message naming the stage and the node; once the node is
// started again on its address, the controller places the stage there again and serves the
// outputs of an undisturbed colocated server, without being restarted.

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day, a bird"};

class cluster_stage_loss_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(credentials(), {"controller", "tokenizers", "engine", "detokenizer"});
    topology_spec colocated;
    reference_.emplace(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                       dir_ / "colocated.log");
    for (const char* name : {"tokenizers", "engine", "detokenizer"}) {
      nodes_.emplace_back(credentials(), name, free_port(), dir_.path());
    }
    topology_spec split;
    split.credentials = credentials();
    split.nodes = {nodes_[0].entry(), nodes_[1].entry(), nodes_[2].entry()};
    split.tokenizers = {"tokenizers"};
    split.engines = {"engine"};
    split.detokenizers = {"detokenizer"};
    controller_.emplace(controller_process::kind::serve, split.write(dir_ / "split-stages.toml"),
                        dir_ / "controller.log");
    mix_ = request_mix(8, prompts, 40, 80, true, 11);
    expected_.resize(mix_.size());
    auto threads = send_together(*reference_, mix_, 0, mix_.size(), expected_);
    for (auto& t : threads) t.join();
    for (const outcome& o : expected_) ASSERT_EQ(o.error, "") << "reference: " << o;
  }

  fs::path credentials() const { return dir_ / "certs"; }

  // Kills `node`, checks that a request on either door fails naming `stage` on it, starts the
  // node again and checks that the cluster serves the reference outputs and frees every block.
  void lose_and_get_back(node_process& node, const std::string& stage) {
    const std::vector<outcome> before = run_in_waves(*controller_, mix_, mix_.size());
    for (size_t i = 0; i < mix_.size(); ++i) ASSERT_TRUE(same_output(before[i], expected_[i])) << before[i];

    node.kill9();
    const std::string failed = "the " + stage + " stage on node " + node.name() + " failed";
    ASSERT_TRUE(controller_->wait_for_log(failed, 1, 20s)) << controller_->log();
    for (bool http : {false, true}) {
      mixed_request late = mix_[0];
      late.http = http;
      const outcome o = run_one(*controller_, late, 30s);
      EXPECT_NE(o.error.find(failed), std::string::npos) << (http ? "HTTP: " : "ZeroMQ: ") << o;
    }

    node.start();
    ASSERT_TRUE(controller_->wait_for_log("serving again: the " + stage + " stage on node " + node.name() + " is back", 1,
                                          30s))
        << controller_->log();
    const std::vector<outcome> after = run_in_waves(*controller_, mix_, mix_.size());
    for (size_t i = 0; i < mix_.size(); ++i) EXPECT_TRUE(same_output(after[i], expected_[i])) << after[i];
    const stats_reply idle = wait_until_idle(*controller_);
    EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks);
    if (HasFailure()) ADD_FAILURE() << "controller log:\n" << controller_->log();
  }

  scratch_dir dir_;
  std::optional<controller_process> reference_;
  std::deque<node_process> nodes_;  // before controller_, which stops first
  std::optional<controller_process> controller_;
  std::vector<mixed_request> mix_;
  std::vector<outcome> expected_;
};

TEST_F(cluster_stage_loss_e2e, a_lost_tokenizer_node_fails_requests_by_name_and_serves_again_when_back) {
  lose_and_get_back(nodes_[0], "tokenizer");
}

TEST_F(cluster_stage_loss_e2e, a_lost_detokenizer_node_fails_requests_by_name_and_serves_again_when_back) {
  lose_and_get_back(nodes_[2], "detokenizer");
}

}  // namespace
}  // namespace troupe::test::cluster
