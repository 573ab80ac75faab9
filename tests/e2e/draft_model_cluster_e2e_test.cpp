// A topology's [speculative] table reaches engine instances on other nodes: the worker a
// `troupe node` spawns from its worker_spec loads the draft model the controller named and logs
// it, its scheduler plans draft slots, and the answers equal a plain colocated server's, for a
// mixed instance and for a disaggregated prefill/decode pair.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

std::vector<generate_request> requests() {
  std::vector<generate_request> out;
  const std::vector<std::string> prompts = {"Once upon a time", "Lily and Ben went to the park", "The little dog",
                                            "Tom had a red ball. Tom had a red ball"};
  for (size_t i = 0; i < 8; ++i) out.push_back(greedy(prompts[i % prompts.size()], 20 + 5 * static_cast<int>(i)));
  return out;
}

std::vector<std::vector<int32_t>> answers(const std::string& endpoint) {
  std::vector<std::vector<int32_t>> out;
  for (const generate_request& r : requests()) {
    client c(endpoint);
    c.set_timeout(60s);
    out.push_back(c.generate(r).token_ids);
  }
  return out;
}

// The steps each request took, from the controller's trace (its request spans count them).
std::vector<int> steps_of_requests(int http_port) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_read_timeout(30, 0);
  auto res = http.Get("/debug/trace?seconds=600");
  std::vector<int> steps;
  if (!res || res->status != 200) {
    ADD_FAILURE() << "no trace from the controller";
    return steps;
  }
  const nlohmann::json trace = nlohmann::json::parse(res->body);
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "request") steps.push_back(e["args"]["steps"].get<int>());
  }
  return steps;
}

class draft_model_cluster_e2e : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories_root / "hf" / "config.json"); }

  // Launches `topology` with a draft model of stories260K itself, checks its answers and that
  // the workers on `nodes` drafted from it.
  void expect_drafted_answers(topology_spec topology, const std::vector<std::string>& nodes) {
    topology.credentials = dir_.path() / "certs";
    std::vector<std::string> members = {"controller"};
    for (auto& n : topology.nodes) {
      n.port = free_port();
      members.push_back(n.name);
    }
    make_credentials(topology.credentials, members);
    const std::string toml = topology.toml() + "[speculative]\nnum_draft_tokens = 4\nmax_draft_tokens = 8\n" +
                             "draft_model = \"" + stories_dir + "\"\ndraft_kv_memory_mb = 8\n";
    const fs::path file = dir_.path() / "speculative.toml";
    std::ofstream(file) << toml;

    std::vector<std::vector<int32_t>> plain;
    {
      serve_process server({"--num-speculative-tokens", "0"});
      plain = answers(server.endpoint());
    }
    controller_process launch(controller_process::kind::launch, file, dir_.path() / "launch.log");
    EXPECT_EQ(answers(launch.endpoint()), plain);
    // Each node's worker says so in its own log, which launch prefixes with the node's name.
    const std::string drafting = "worker: speculative decoding drafts from draft model " + stories_dir + " (vocab 512)";
    EXPECT_TRUE(launch.wait_for_log(drafting, static_cast<int>(nodes.size()), 10s)) << launch.log();
    const std::string log = launch.log();
    for (const std::string& node : nodes) {
      std::istringstream lines(log);
      bool found = false;
      for (std::string line; std::getline(lines, line);) {
        found = found || (line.rfind(node + " | ", 0) == 0 && line.find(drafting) != std::string::npos);
      }
      EXPECT_TRUE(found) << node << " logged no draft model:\n" << log;
    }
    EXPECT_EQ(count_of(log, drafting), static_cast<int>(nodes.size())) << log;
    // The requests took far fewer steps than tokens (plain decoding takes one per token): the
    // drafts ran, and were accepted.
    const std::vector<int> steps = steps_of_requests(launch.http_port());
    ASSERT_EQ(steps.size(), requests().size());
    int num_steps = 0, num_tokens = 0;
    for (int s : steps) num_steps += s;
    for (const generate_request& r : requests()) num_tokens += r.sampling.max_tokens;
    EXPECT_LT(num_steps * 3, num_tokens) << launch.log();
  }

  troupe::testing::scratch_dir dir_;
};

TEST_F(draft_model_cluster_e2e, an_engine_on_another_node_drafts_with_the_controllers_draft_model) {
  topology_spec topology;
  topology.nodes = {{"engine-a", 0}};
  topology.engines = {"engine-a"};
  expect_drafted_answers(topology, {"engine-a"});
}

TEST_F(draft_model_cluster_e2e, a_disaggregated_pair_drafts_and_answers_as_one_process) {
  topology_spec topology;
  topology.nodes = {{"prefill-a", 0}, {"decode-a", 0}};
  topology.engines = {};
  topology.prefill = {"prefill-a"};
  topology.decode = {"decode-a"};
  expect_drafted_answers(topology, {"prefill-a", "decode-a"});
}

}  // namespace
}  // namespace troupe::test::cluster
