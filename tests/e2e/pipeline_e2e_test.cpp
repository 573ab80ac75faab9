// Pipeline stages across processes through the real binary (issue 27): `troupe stage` processes
// hold stories260K's earlier layers, `troupe serve --pipeline-stage` the rest. Greedy outputs
// equal the colocated server's (and the trained model's references), also with chunked prefill
// forced small, three micro-batches, three stages and speculative decoding; a stage that dies
// fails the requests by name instead of hanging them; a stage that is not the one named is
// refused at start.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/e2e_support.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/e2e/stage_process.hpp"

namespace troupe::test {
namespace {

// Twelve greedy requests at once: the references' prompts and more, prompts sharing prefixes.
std::vector<generate_request> requests() {
  std::vector<generate_request> all;
  for (const auto& ref : stories_references()) {
    all.push_back(greedy(ref.at("prompt").get<std::string>(), ref.at("max_new_tokens").get<int>()));
  }
  const char* prompts[] = {"Once upon a time", "Once upon a time there was",   "The cat", "The dog and the cat",
                           "Lily wanted",      "Tom and Sue went to the park", "One day", "One day, a big"};
  for (int i = 0; i < 9; ++i) all.push_back(greedy(prompts[i % 8], 12 + 5 * i));
  return all;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<completion>& outputs) {
  std::vector<std::vector<int32_t>> tokens;
  for (const completion& c : outputs) tokens.push_back(c.token_ids);
  return tokens;
}

std::vector<std::vector<int32_t>> colocated_tokens() {
  serve_process colocated({});
  return tokens_of(serve_together(colocated, requests()));
}

TEST(pipeline_e2e, two_stages_answer_like_the_colocated_server_and_the_references) {
  const auto expected = colocated_tokens();
  stage_process front("0-1");
  serve_process pipelined({"--pipeline-stage", front.argument("0-1")});
  const std::vector<completion> outputs = serve_together(pipelined, requests());
  EXPECT_EQ(tokens_of(outputs), expected);
  const auto refs = stories_references();
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(outputs[i].text, refs[i].at("completion").get<std::string>()) << refs[i].at("prompt");
  }
  EXPECT_NE(pipelined.log().find("pipeline of 2 stages (layers 0-1 at "), std::string::npos) << pipelined.log();
}

TEST(pipeline_e2e, three_stages_small_chunks_micro_batches_and_drafts_answer_the_same) {
  const auto expected = colocated_tokens();
  stage_process first("0-0");
  stage_process second("1-2");
  serve_process pipelined({"--pipeline-stage", first.argument("0-0"), "--pipeline-stage", second.argument("1-2"),
                           "--max-num-batched-tokens", "8", "--micro-batches", "3", "--num-speculative-tokens", "2"});
  EXPECT_EQ(tokens_of(serve_together(pipelined, requests())), expected);
}

TEST(pipeline_e2e, a_stage_that_dies_fails_requests_by_name_past_the_failover_wait_and_the_server_answers) {
  stage_process front("0-1");
  serve_process pipelined({"--pipeline-stage", front.argument("0-1"), "--pipeline-failover-wait-ms", "1000"});
  front.kill_now();
  client c = pipelined.make_client();
  c.set_timeout(std::chrono::seconds(30));
  const auto sent = std::chrono::steady_clock::now();
  try {
    c.generate(greedy("Once upon a time", 20));
    ADD_FAILURE() << "a request through a dead stage succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0-1 at kvtcp://"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("failover_wait_ms (1000 ms)"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(900)) << "it did not wait for the stage";
  EXPECT_TRUE(pipelined.alive());
  // The server still answers, and says which stage is down (as /health does) while its link
  // tries to reconnect.
  try {
    c.stats();
    ADD_FAILURE() << "stats say the engine serves while its stage is down";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0-1 at kvtcp://"), std::string::npos) << e.what();
  }
}

TEST(pipeline_e2e, a_stage_that_is_not_the_one_named_is_refused_at_start) {
  stage_process front("0-1");
  try {
    serve_process pipelined({"--pipeline-stage", front.argument("0-2")});
    ADD_FAILURE() << "serve started with a stage that holds other layers";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the link expects layers 0-2, this stage holds 0-1"), std::string::npos)
        << e.what();
  }
}

// With the cluster's credentials the link is curve:// (CURVE, members only): a stage started with
// `--credentials`, a server whose topology names the same credentials, answers like colocated.
TEST(pipeline_e2e, a_stage_with_the_clusters_credentials_serves_over_curve) {
  const std::filesystem::path certs =
      std::filesystem::temp_directory_path() / ("troupe_pipeline_certs_" + std::to_string(::getpid()));
  std::filesystem::remove_all(certs);
  const run_result made =
      run_troupe("certs --out " + shell_quote(certs.string()) + " --name controller --name stage-a");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const auto expected = colocated_tokens();
  stage_process front("0-1", stories_dir, {"--credentials", certs.string(), "--name", "stage-a"});
  ASSERT_TRUE(front.argument("0-1").starts_with("curve://127.0.0.1:")) << front.argument("0-1");
  const std::filesystem::path topology = certs / "pipeline.toml";
  const std::string argument = front.argument("0-1");
  const size_t at = argument.rfind('@');
  std::ofstream(topology) << "[cluster]\ncredentials = \"" << certs.string() << "\"\nname = \"controller\"\n"
                          << "[pipeline]\nstages = [{ endpoint = \"" << argument.substr(0, at)
                          << "\", layers = \"0-1\" }]\n";
  {
    serve_process pipelined({"--config", topology.string()});
    EXPECT_EQ(tokens_of(serve_together(pipelined, requests())), expected);
  }
  std::filesystem::remove_all(certs);
}

// A model larger than one process's memory budget (issue 27): 8 layers of hidden 512 in Q8_0,
// about 36 MiB of weights, against a budget of 40 MiB of which the KV pool takes 8. Served whole
// it is refused before its weights are read, naming the bytes; cut into two stages under the
// same budget each, it serves, answering like the whole model served without a budget.
TEST(pipeline_e2e, a_model_over_one_budget_is_refused_whole_and_serves_in_two_stages) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("troupe_pipeline_model_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const run_result made = run_troupe(
      "make-model --hidden-size 512 --intermediate-size 2048 --layers 8 --heads 8 "
      "--kv-heads 8 --dtype q8_0 --tokenizer " +
      shell_quote(stories_dir) + " --out " + shell_quote(dir.string()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string model = (dir / "model.gguf").string();
  const std::vector<std::string> budget = {"--memory-budget-mb", "40", "--kv-memory-mb", "8"};
  std::vector<generate_request> prompts = {greedy("Once upon a time", 16), greedy("The cat", 16)};
  std::vector<std::vector<int32_t>> expected;
  {
    serve_process unbounded({"--kv-memory-mb", "8"}, {}, model);
    expected = tokens_of(serve_together(unbounded, prompts));
  }
  try {
    serve_process whole(budget, {}, model);
    ADD_FAILURE() << "the whole model was served within a budget it does not fit";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the weights of layers 0-7 need"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("above the 32.0 MiB this process may hold"), std::string::npos) << e.what();
  }
  {
    stage_process front("0-3", model, budget);
    std::vector<std::string> args = budget;
    args.insert(args.end(), {"--pipeline-stage", front.argument("0-3")});
    serve_process pipelined(args, {}, model);
    EXPECT_EQ(tokens_of(serve_together(pipelined, prompts)), expected);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
