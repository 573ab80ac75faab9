// The controller's own death (issue 26): kill -9 of `troupe serve` whose stages run on another
// node. The node notices and stops every stage that controller placed (they would hold their
// model and KV memory and serve no one); a controller started again with the same topology takes
// the node back, places its stages afresh and serves the reference output.

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// Waits (bounded) until `node`'s log holds `words` at least `times` times.
bool node_logged(const node_process& node, const std::string& words, int times, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < deadline; ++i) {
    if (count_of(node.log(), words) >= times) return true;
    std::this_thread::sleep_for(20ms);
  }
  return count_of(node.log(), words) >= times;
}

class controller_restart_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(dir_ / "certs", {"controller", "stages"});
    node_.emplace(dir_ / "certs", "stages", free_port(), dir_.path());
    topology_spec split;
    split.credentials = dir_ / "certs";
    split.nodes = {node_->entry()};
    split.tokenizers = {"stages"};
    split.engines = {"stages"};
    split.detokenizers = {"stages"};
    topology_ = split.write(dir_ / "split.toml");
  }

  std::string greedy_once_upon_a_time(const controller_process& controller) {
    client c = controller.make_client(60s);
    generate_request request;
    request.prompt = "Once upon a time";
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = 60;
    return c.generate(request).text;
  }

  scratch_dir dir_;
  std::optional<node_process> node_;
  fs::path topology_;
};

TEST_F(controller_restart_e2e, a_node_stops_the_stages_of_a_killed_controller_and_a_restarted_one_takes_it_back) {
  const std::string reference = stories_reference("Once upon a time").at("completion").get<std::string>();
  const std::string spawned = "spawned by a controller";
  int placed = 0;
  {
    controller_process first(controller_process::kind::serve, topology_, dir_ / "controller.0.log");
    EXPECT_EQ(greedy_once_upon_a_time(first), reference);
    placed = count_of(node_->log(), spawned);
    ASSERT_GE(placed, 3) << "tokenizer, engine and detokenizer stages on the node:\n" << node_->log();

    ASSERT_EQ(::kill(first.pid(), SIGKILL), 0);
    EXPECT_NE(first.wait_for_exit(10s), -1) << "the controller outlived SIGKILL";
    ASSERT_TRUE(node_logged(*node_, "the controller that placed", 1, 20s))
        << "the node did not notice its controller's death:\n"
        << node_->log();
    // Every stage it placed ends: the ones linked to the controller's actors on their own
    // ("ended: ... remote_link_unreachable"), the rest stopped by the node ("stopped"). The worker
    // (the model and the KV pool) is usually among the stopped, but its links can carry the
    // controller's death to it first (seen once in CI): either way it ends.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    auto num_ended = [&] { return count_of(node_->log(), "stopped") + count_of(node_->log(), "ended:"); };
    for (int i = 0; i < 1000 && num_ended() < placed && std::chrono::steady_clock::now() < deadline; ++i) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(num_ended(), placed) << node_->log();
    EXPECT_GE(count_of(node_->log(), "stage worker stopped") + count_of(node_->log(), "stage worker ended:"), 1)
        << node_->log();
  }
  EXPECT_TRUE(node_->alive()) << "the node itself keeps running for the next controller";

  controller_process second(controller_process::kind::serve, topology_, dir_ / "controller.1.log");
  EXPECT_EQ(greedy_once_upon_a_time(second), reference);
  EXPECT_EQ(count_of(node_->log(), spawned), 2 * placed) << "the new controller placed its stages afresh";
  EXPECT_EQ(count_of(node_->log(), "the controller that placed"), 1) << node_->log();
}

}  // namespace
}  // namespace troupe::test::cluster
