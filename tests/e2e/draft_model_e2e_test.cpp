// Speculative decoding with a draft model, through the real server: greedy outputs equal a server
// without speculation whether the draft is the target itself (every draft right) or a random
// model of the same vocabulary (nearly every draft wrong; made by make-model, or a config.json), the draft is named in
// the log, and a draft of another vocabulary stops the server at startup naming it. `troupe generate` likewise.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> prompts = {
    "Once upon a time",   "Lily and Ben went to the park",
    "The little dog",     "One day, a girl named Sue",
    "Tom had a red ball", "The sun was hot",
    "Mom said",           "A big bird flew",
};

// ~20 greedy requests of different prompts and lengths, some repeating their prompt's words.
std::vector<generate_request> request_mix() {
  std::vector<generate_request> requests;
  for (int i = 0; i < 20; ++i) {
    std::string prompt = prompts[i % prompts.size()];
    if (i % 3 == 2) prompt += ". " + prompt + ". " + prompt;
    requests.push_back(greedy(prompt, 16 + (i * 7) % 33));
  }
  return requests;
}

std::vector<std::vector<int32_t>> served_outputs(const std::vector<std::string>& args) {
  serve_process server(args);
  std::vector<std::vector<int32_t>> outputs;
  for (const completion& c : serve_together(server, request_mix())) outputs.push_back(c.token_ids);
  client c = server.make_client();
  const stats_reply idle = wait_until_idle(c);
  EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks);
  return outputs;
}

// Steps the server's engine ran for one greedy request of 60 tokens, from its trace (the
// request's span counts them): with every
// draft accepted a step yields up to 1 + drafts tokens, so this shows the drafts really ran.
int steps_for_one_request(const std::vector<std::string>& args) {
  std::vector<std::string> with_http = args;
  with_http.insert(with_http.end(), {"--http-port", "0"});
  serve_process server(with_http);
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  const completion done = c.generate(greedy("Once upon a time", 60));
  EXPECT_EQ(done.token_ids.size(), 60u);
  httplib::Client http("127.0.0.1", server.http_port());
  http.set_read_timeout(30, 0);
  auto res = http.Get("/debug/trace?seconds=300");
  if (!res || res->status != 200) {
    ADD_FAILURE() << "no trace from the server";
    return -1;
  }
  const nlohmann::json trace = nlohmann::json::parse(res->body);
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "request") return e["args"]["steps"].get<int>();
  }
  ADD_FAILURE() << "no request in the trace: " << res->body.substr(0, 2000);
  return -1;
}

// The server's log once it holds `words` (the node logs its settings just after the doors open,
// so a client may be answered first), or as it is after a bounded wait.
std::string log_with(const serve_process& server, const std::string& words) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string log = server.log();
  for (int i = 0; i < 500 && log.find(words) == std::string::npos && std::chrono::steady_clock::now() < deadline; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = server.log();
  }
  return log;
}

class draft_model_e2e : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories_root / "hf" / "config.json"); }

  // A random 2-layer model of stories260K's tokenizer: a draft that is almost always wrong.
  std::string random_draft() {
    const fs::path out = dir_.path() / "random-draft";
    const run_result made = run_troupe(
        "make-model --layers 2 --hidden-size 32 --heads 4 --kv-heads 2 --seed 7 "
        "--tokenizer " +
        shell_quote(stories_dir) + " --out " + shell_quote(out.string()));
    EXPECT_EQ(made.exit_code, 0) << made.err;
    return out.string();
  }

  testing::scratch_dir dir_;
};

TEST_F(draft_model_e2e, greedy_outputs_equal_plain_decoding_with_a_good_and_a_random_draft) {
  const std::vector<std::vector<int32_t>> plain = served_outputs({"--num-speculative-tokens", "0"});
  ASSERT_EQ(plain.size(), 20u);
  for (const auto& ids : plain) ASSERT_FALSE(ids.empty());
  const std::vector<std::vector<int32_t>> self_drafted =
      served_outputs({"--draft-model", stories_dir, "--num-speculative-tokens", "4"});
  EXPECT_EQ(self_drafted, plain);
  const std::vector<std::vector<int32_t>> random_drafted =
      served_outputs({"--draft-model", random_draft(), "--num-speculative-tokens", "3", "--draft-kv-memory-mb", "4"});
  EXPECT_EQ(random_drafted, plain);
  // A config.json alone: random weights of its shape, no tokenizer needed.
  const fs::path dummy = dir_.path() / "dummy";
  fs::create_directories(dummy);
  fs::copy(stories_root / "hf" / "config.json", dummy / "config.json");
  const std::vector<std::vector<int32_t>> dummy_drafted =
      served_outputs({"--draft-model", (dummy / "config.json").string(), "--num-speculative-tokens", "2"});
  EXPECT_EQ(dummy_drafted, plain);
}

TEST_F(draft_model_e2e, the_server_drafts_so_a_request_takes_fewer_steps) {
  const int plain = steps_for_one_request({});
  const int drafted = steps_for_one_request({"--draft-model", stories_dir, "--num-speculative-tokens", "4"});
  EXPECT_GE(plain, 60);
  EXPECT_GT(drafted, 0);
  // Every draft of the target drafting for itself is accepted: 5 tokens a step, but for the first.
  EXPECT_LE(drafted * 3, plain) << "plain " << plain << " steps, drafted " << drafted;
}

TEST_F(draft_model_e2e, the_worker_names_its_draft_and_the_server_its_defaults) {
  serve_process server(
      {"--draft-model", stories_dir, "--num-speculative-tokens", "2", "--max-speculative-tokens", "5"});
  const std::string log = log_with(server, "speculative decoding: 2 drafts");
  EXPECT_NE(log.find("worker: speculative decoding drafts from draft model " + stories_dir + " (vocab 512)"),
            std::string::npos)
      << log;
  EXPECT_NE(
      log.find("speculative decoding: 2 drafts per step for requests that do not choose, up to 5, from draft model"),
      std::string::npos)
      << log;
}

TEST_F(draft_model_e2e, without_a_draft_model_the_worker_looks_up_n_grams_as_the_flags_say) {
  serve_process server({"--ngram-min", "1", "--ngram-max", "3", "--num-speculative-tokens", "2"});
  const std::string log = log_with(server, "speculative decoding: 2 drafts");
  EXPECT_NE(log.find("worker: speculative decoding drafts by n-gram prompt lookup, n=1..3"), std::string::npos) << log;
  EXPECT_NE(log.find("speculative decoding: 2 drafts per step for requests that do not choose, up to 16, from n-gram "
                     "prompt lookup n=1..3"),
            std::string::npos)
      << log;
  // Settings that cannot work stop the server before it loads anything, naming the field.
  const run_result r =
      run_command("timeout 60 " + shell_quote(troupe_binary.string()) + " serve --model " + shell_quote(stories_dir) +
                  " --threads 1 --zmq-endpoint 'tcp://127.0.0.1:*' " + "--ngram-min 5 --ngram-max 3 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[speculative] ngram_max 3 is below ngram_min 5"), std::string::npos) << r.out;
}

TEST_F(draft_model_e2e, a_draft_of_another_vocabulary_stops_the_server_naming_it) {
  // Dummy weights of a config.json: a draft needs no tokenizer, only the target's vocab_size.
  const fs::path other = dir_.path() / "other-vocab";
  fs::create_directories(other);
  std::ifstream in(stories_root / "hf" / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["vocab_size"] = 1000;
  std::ofstream(other / "config.json") << config.dump();
  const run_result r = run_command("timeout 60 " + shell_quote(troupe_binary.string()) + " serve --model " +
                                   shell_quote(stories_dir) + " --threads 1 --zmq-endpoint 'tcp://127.0.0.1:*' " +
                                   "--draft-model " + shell_quote((other / "config.json").string()) + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("has vocab_size 1000, the target model 512"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find((other / "config.json").string()), std::string::npos) << r.out;
}

TEST_F(draft_model_e2e, generate_with_a_draft_prints_what_plain_generate_prints) {
  const std::string base = "generate --model " + shell_quote(stories_dir) +
                           " --prompt 'Once upon a time' --temperature 0 --max-tokens 40 --threads 1";
  const run_result plain = run_troupe(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const run_result drafted = run_troupe(base + " --num-speculative-tokens 4 --draft-model " + shell_quote(stories_dir));
  ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
  EXPECT_EQ(drafted.out, plain.out);
  const run_result ngram = run_troupe(base + " --num-speculative-tokens 3 --ngram-min 1 --ngram-max 3");
  ASSERT_EQ(ngram.exit_code, 0) << ngram.err;
  EXPECT_EQ(ngram.out, plain.out);
  const run_result bad = run_troupe(base + " --num-speculative-tokens 2 --ngram-min 3 --ngram-max 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--ngram-min 3 and --ngram-max 2"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace troupe::test
