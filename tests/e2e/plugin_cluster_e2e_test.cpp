// Plugins on other nodes of a launched topology (issue 28): the tokenizers and the detokenizer on
// node "front", the engine on node "engine", `troupe launch` starting both. The request hook
// (the token quota) runs in the tokenizers on front, the output hook (the PII redactor) in the
// detokenizer on front, the logits hook (banned phrases, named by half the requests) in the
// worker on engine, each loaded there from its stage's spec. 16 greedy streams, half over ZeroMQ
// and half over HTTP, answer as a colocated server with the same plugins does; /metrics shows
// the hooks' calls on their nodes. Then kill -9 of front mid-stream: its stages are placed on the
// controller, each stream goes on and completes with the colocated server's text — the
// redactor's state for a stream (the held-back start of the word it hides) is rebuilt by the new
// detokenizer, so no word leaks and no held text is lost.

#include <gtest/gtest.h>

#include <httplib.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "text/tokenizer.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

const std::vector<std::string> prompts = {"Once upon a time", "Lily and Tom went to the park", "One day, a girl named",
                                          "The little dog"};

std::string example_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/plugins/libtroupe_" + name + ".so";
}

// The phrase the logits plugin bans, as token ids (what /tokenize gives a user).
std::string banned_phrase_ids() {
  const std::vector<int32_t> ids = tokenizer::from_directory(stories_dir).encode("named Lily", false);
  std::string list = "[";
  for (size_t i = 0; i < ids.size(); ++i) list += (i ? ", " : "") + std::to_string(ids[i]);
  return list + "]";
}

// The quota (large: it only counts here), the redactor, hiding "Lily", and the banned phrase.
std::string plugins_toml() {
  return "[[plugins]]\nlibrary = \"" + example_plugin("token_quota") +
         "\"\nconfig = { tokens_per_key = 1000000, anonymous = true }\n"
         "[[plugins]]\nlibrary = \"" +
         example_plugin("pii_redactor") + "\"\nconfig = { word = \"Lily\" }\n" + "[[plugins]]\nlibrary = \"" +
         example_plugin("banned_phrases") + "\"\nconfig = { phrases = [" + banned_phrase_ids() + "] }\n";
}

// The value of the first `metric` line of `text` whose labels hold every one of `labels`; -1
// when none does.
double metric_value(const std::string& text, const std::string& metric, const std::vector<std::string>& labels) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(metric + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

class plugin_cluster_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(dir_ / "certs", {"controller", "front", "engine"});
    mix_ = request_mix(16, prompts, 100, 200, true, 29);
    for (size_t i = 0; i < mix_.size(); ++i) {
      mix_[i].request.sampling.temperature = 0.0f;
      mix_[i].request.stream = true;
      if (i % 2 == 1) mix_[i].request.sampling.logits_plugins = {"banned_phrases"};
    }
    topology_spec colocated;
    colocated.extra_toml = plugins_toml();
    controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                                 dir_ / "colocated.log");
    expected_ = run_in_waves(reference, mix_, mix_.size());
    size_t num_redacted = 0, num_with_phrase = 0;
    for (size_t i = 0; i < expected_.size(); ++i) {
      const outcome& o = expected_[i];
      ASSERT_EQ(o.error, "") << "reference: " << o;
      EXPECT_EQ(o.text.find("Lily"), std::string::npos) << "the colocated redactor let the word through: " << o;
      num_redacted += o.text.find("[redacted]") != std::string::npos;
      // "named Lily", redacted: never in a request that names the banned phrase.
      const bool has_phrase = o.text.find("named [redacted]") != std::string::npos;
      if (i % 2 == 1) {
        EXPECT_FALSE(has_phrase) << "request " << i << " names the banned phrase: " << o;
      }
      num_with_phrase += has_phrase;
    }
    ASSERT_GT(num_redacted, 4u) << "too few streams meet the redactor's word to test it";
    ASSERT_GT(num_with_phrase, 0u) << "no stream that does not ban the phrase has it: the ban tests nothing";
  }

  // `troupe launch` of front (tokenizers, detokenizer) and engine, with the plugins.
  controller_process launch(const std::string& name) {
    topology_spec split;
    split.credentials = dir_ / "certs";
    split.nodes = {{"front", free_port(), ""}, {"engine", free_port(), ""}};
    split.tokenizers = {"front"};
    split.engines = {"engine"};
    split.detokenizers = {"front"};
    split.extra_toml = plugins_toml();
    return controller_process(controller_process::kind::launch, split.write(dir_ / (name + ".toml")),
                              dir_ / (name + ".log"));
  }

  std::string metrics(const controller_process& server) const {
    httplib::Client c("127.0.0.1", server.http_port());
    c.set_read_timeout(10, 0);
    auto res = c.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  }

  scratch_dir dir_;
  std::vector<mixed_request> mix_;
  std::vector<outcome> expected_;
};

TEST_F(plugin_cluster_e2e, each_hook_runs_on_the_node_of_its_stage_through_both_doors) {
  controller_process cluster = launch("split");
  const std::vector<outcome> got = run_in_waves(cluster, mix_, 8);
  for (size_t i = 0; i < mix_.size(); ++i) {
    EXPECT_TRUE(same_output(got[i], expected_[i])) << "request " << i << ": " << got[i] << " != " << expected_[i];
  }
  const std::string text = metrics(cluster);
  EXPECT_GT(metric_value(text, "troupe:plugin_calls_total",
                         {"node=\"front\"", "stage=\"detokenizer\"", "plugin=\"pii-redactor\"", "hook=\"output\""}),
            0)
      << text;
  EXPECT_GT(
      metric_value(text, "troupe:plugin_calls_total", {"node=\"front\"", "stage=\"tokenizer\"", "hook=\"request\""}), 0)
      << text;
  EXPECT_GT(metric_value(text, "troupe:plugin_calls_total",
                         {"node=\"engine\"", "stage=\"worker\"", "plugin=\"banned_phrases\"", "hook=\"logits\""}),
            0)
      << text;
  EXPECT_LT(metric_value(text, "troupe:plugin_calls_total", {"node=\"controller\"", "hook=\"output\""}), 1) << text;
}

TEST_F(plugin_cluster_e2e, the_plugins_node_killed_mid_stream_loses_no_text_and_leaks_no_word) {
  const uint64_t seed = failover_seed("plugin_cluster_e2e");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int trial = 0; trial < 3; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    controller_process cluster = launch("kill-" + std::to_string(trial));
    const pid_t front = cluster.launched_pids().at("front");
    const auto kill_after = std::chrono::milliseconds(20 + static_cast<int>(rng() % 200));
    std::vector<outcome> got(mix_.size());
    auto threads = send_together(cluster, mix_, 0, mix_.size(), got, 60s);
    std::this_thread::sleep_for(kill_after);
    ASSERT_EQ(::kill(front, SIGKILL), 0);
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < mix_.size(); ++i) {
      EXPECT_TRUE(same_output(got[i], expected_[i])) << "request " << i << " after kill -9 at " << kill_after.count()
                                                     << " ms: " << got[i] << " != " << expected_[i];
    }
    EXPECT_TRUE(cluster.wait_for_log("detokenizer stage of node front now runs on controller", 1, 20s))
        << cluster.log();
    if (HasFailure()) {
      ADD_FAILURE() << "launch log:\n" << cluster.log();
      return;
    }
  }
}

}  // namespace
}  // namespace troupe::test::cluster
