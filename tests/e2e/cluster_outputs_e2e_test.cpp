// A cluster answers like one process: the same mix of requests (greedy and seeded, streamed and
// not, ZeroMQ and HTTP) through a replicas-2 and a split-stages topology, each started with
// `troupe launch` (every node its own process on 127.0.0.1), gives the outputs of a colocated
// `troupe serve` of the same model and settings: text, token ids, finish reason, usage. For
// stories260K and for a 12-layer random model, where a layer or a KV block mixed up between
// nodes would show.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

const std::vector<std::string> prompts = {"Once upon a time",
                                          "The little dog",
                                          "Lily and Tom went to the park. They saw a big tree",
                                          "One day, a bird",
                                          "Tim had a red ball. He liked to play with it every day",
                                          "The sun"};

constexpr size_t num_requests = 100;  // per model and topology: 200 through each topology, 400 in all
constexpr size_t wave = 15;

class cluster_outputs_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(dir_ / "certs", {"controller", "engine-a", "engine-b", "tokenizers", "engine", "detokenizer"});
  }

  // The colocated outputs of `mix` on `model`, then the same through replicas-2 and
  // split-stages, each compared with them.
  void expect_clusters_answer_like_one_process(const std::string& model, const std::vector<mixed_request>& mix) {
    std::vector<outcome> expected;
    {
      topology_spec colocated;
      colocated.model_path = model;
      controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                                   dir_ / "colocated.log");
      expected = run_in_waves(reference, mix, wave);
      for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(expected[i].error, "") << "reference " << i;
    }

    topology_spec replicas;
    replicas.model_path = model;
    replicas.credentials = dir_ / "certs";
    replicas.nodes = {{"engine-a", free_port()}, {"engine-b", free_port()}};
    replicas.engines = {"engine-a", "engine-b"};
    expect_equal_outputs("replicas-2", replicas, mix, expected, {{"engine-a", 32768}, {"engine-b", 32768}});

    topology_spec split;
    split.model_path = model;
    split.credentials = dir_ / "certs";
    split.nodes = {{"tokenizers", free_port()}, {"engine", free_port()}, {"detokenizer", free_port()}};
    split.tokenizers = {"tokenizers"};
    split.engines = {"engine"};
    split.detokenizers = {"detokenizer"};
    expect_equal_outputs("split-stages", split, mix, expected,
                         {{"tokenizers", 4096}, {"engine", 32768}, {"detokenizer", 32768}});
  }

  void expect_equal_outputs(const std::string& name, const topology_spec& topology,
                            const std::vector<mixed_request>& mix, const std::vector<outcome>& expected,
                            const std::map<std::string, long>& busy) {
    expect_launch_answers_like(dir_.path(), name, topology, mix, expected, busy, wave);
  }

  scratch_dir dir_;
};

TEST_F(cluster_outputs_e2e, stories260k_through_replicas_and_split_stages_equals_one_process) {
  expect_clusters_answer_like_one_process(stories_dir, request_mix(num_requests, prompts, 8, 96, true, 1));
}

TEST_F(cluster_outputs_e2e, a_12_layer_model_through_replicas_and_split_stages_equals_one_process) {
  const fs::path model = dir_ / "model-12";
  const run_result made = run_troupe("make-model --layers 12 --seed 12 --tokenizer " + shell_quote(stories_dir) +
                                     " --out " + shell_quote(model.string()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  expect_clusters_answer_like_one_process(model.string(), request_mix(num_requests, prompts, 8, 64, true, 2));
}

}  // namespace
}  // namespace troupe::test::cluster
