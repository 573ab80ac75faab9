// Speculative decoding through the real server's doors, on stories260K: a request that asks for
// drafts over HTTP or ZeroMQ gets the same greedy text as one that turns them off, its final
// usage says how many drafts were verified and accepted, /metrics counts them, troupe-bench
// reports them, and a bad draft length is refused naming the field while the server serves on.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const fs::path bench_binary = fs::path(TROUPE_BINARY_DIR) / "bin" / "troupe-bench";

// A prompt that repeats itself, so that the output (which continues the pattern) has n-gram
// matches in its own history for the prompt-lookup proposer to draft from.
const std::string repeating_prompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside. "
    "Once upon a time, there was a little girl named Lily. She loved to play outside. "
    "Once upon a time, there was";

httplib::Client http_client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  return c;
}

json post_completion(int port, json body) {
  body["model"] = "stories260K";
  auto res = http_client(port).Post("/v1/completions", body.dump(), "application/json");
  if (!res) throw std::runtime_error("POST /v1/completions failed: " + httplib::to_string(res.error()));
  json out = json::parse(res->body, nullptr, false);
  out["status"] = res->status;
  return out;
}

// The unlabelled samples of /metrics by name.
std::map<std::string, double> metrics(int port) {
  std::map<std::string, double> values;
  auto res = http_client(port).Get("/metrics");
  if (!res || res->status != 200) return values;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    values[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return values;
}

json greedy(int num_speculative_tokens) {
  return {{"prompt", repeating_prompt},
          {"max_tokens", 48},
          {"temperature", 0},
          {"ignore_eos", true},
          {"num_speculative_tokens", num_speculative_tokens}};
}

class speculative_wire : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "hf" / "config.json");
    if (!fs::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  }
};

TEST_F(speculative_wire, drafts_change_no_text_and_show_in_usage_and_metrics) {
  serve_process server({"--http-port", "0", "--served-model-name", "stories260K"});
  const int port = server.http_port();
  const auto before = metrics(port);
  ASSERT_EQ(before.at("troupe_spec_draft_tokens_total"), 0.0);
  ASSERT_EQ(before.at("troupe_spec_acceptance_rate"), 0.0);

  const json plain = post_completion(port, greedy(0));
  ASSERT_EQ(plain["status"], 200) << plain.dump();
  EXPECT_FALSE(plain["usage"].contains("speculative")) << plain["usage"].dump();
  const auto after_plain = metrics(port);
  EXPECT_EQ(after_plain.at("troupe_spec_draft_tokens_total"), 0.0);
  // Every sampling step counts, speculating or not: 48 tokens, one per step.
  EXPECT_EQ(after_plain.at("troupe_spec_sampling_steps_total"), 48.0);

  const json fast = post_completion(port, greedy(4));
  ASSERT_EQ(fast["status"], 200) << fast.dump();
  EXPECT_EQ(fast["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(fast["usage"]["completion_tokens"], 48);
  ASSERT_TRUE(fast["usage"].contains("speculative")) << fast["usage"].dump();
  const json& spec = fast["usage"]["speculative"];
  const int drafts = spec["draft_tokens"];
  const int accepted = spec["accepted_tokens"];
  EXPECT_GT(accepted, 0) << spec.dump();
  EXPECT_LE(accepted, drafts);
  EXPECT_DOUBLE_EQ(spec["acceptance_rate"].get<double>(), static_cast<double>(accepted) / drafts);
  // 48 tokens in 48 - accepted steps: each step gave one token and the drafts it accepted.
  EXPECT_DOUBLE_EQ(spec["tokens_per_step"].get<double>(), 48.0 / (48 - accepted));

  const auto after = metrics(port);
  EXPECT_EQ(after.at("troupe_spec_draft_tokens_total"), drafts);
  EXPECT_EQ(after.at("troupe_spec_accepted_tokens_total"), accepted);
  EXPECT_EQ(after.at("troupe_spec_sampling_steps_total"), 48.0 + (48 - accepted));
  EXPECT_DOUBLE_EQ(after.at("troupe_spec_acceptance_rate"), static_cast<double>(accepted) / drafts);
  EXPECT_EQ(after.at("troupe_spec_tokens_per_step_count"), 1.0);

  // The stream's usage chunk carries the same figures.
  json streamed = greedy(4);
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  streamed["model"] = "stories260K";
  auto res = http_client(port).Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200);
  const size_t usage_at = res->body.find("\"speculative\"");
  ASSERT_NE(usage_at, std::string::npos) << res->body;
  const size_t start = res->body.rfind("data: ", usage_at) + 6;
  const json chunk = json::parse(res->body.substr(start, res->body.find("\n\n", start) - start));
  EXPECT_EQ(chunk["usage"]["speculative"], spec);

  // ZeroMQ: the same request through the client library.
  client c = server.make_client();
  generate_request request;
  request.prompt = repeating_prompt;
  request.sampling.max_tokens = 48;
  request.sampling.temperature = 0;
  request.sampling.ignore_eos = true;
  request.sampling.num_speculative_tokens = 4;
  const completion done = c.generate(request);
  EXPECT_EQ(done.text, fast["choices"][0]["text"]);
  ASSERT_TRUE(done.usage.speculative);
  EXPECT_EQ(done.usage.speculative->draft_tokens, drafts);
  EXPECT_EQ(done.usage.speculative->accepted_tokens, accepted);
  EXPECT_DOUBLE_EQ(done.usage.speculative->tokens_per_step, spec["tokens_per_step"].get<double>());
  request.sampling.num_speculative_tokens = 0;
  EXPECT_FALSE(c.generate(request).usage.speculative);
}

TEST_F(speculative_wire, a_bad_draft_length_is_refused_naming_it_and_the_server_serves_on) {
  serve_process server({"--http-port", "0", "--served-model-name", "stories260K"});
  const json refused = post_completion(server.http_port(), greedy(17));
  EXPECT_EQ(refused["status"], 400);
  EXPECT_EQ(refused["error"]["param"], "num_speculative_tokens") << refused.dump();
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("17 is out of range [-1, 16]"), std::string::npos);

  client c = server.make_client();
  json frame = {{"type", "generate"}, {"id", "bad"}, {"prompt", "Once"}, {"num_speculative_tokens", "four"}};
  const std::vector<uint8_t> bytes = json::to_msgpack(frame);
  c.send_raw(std::string(bytes.begin(), bytes.end()));
  const auto reply = c.receive(std::chrono::seconds(30));
  ASSERT_TRUE(reply);
  const auto* error = std::get_if<error_reply>(&*reply);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, error_code::bad_request);
  EXPECT_EQ(error->message, "field 'num_speculative_tokens': expected an integer, got string");

  const json served = post_completion(server.http_port(), greedy(2));
  EXPECT_EQ(served["status"], 200) << served.dump();
}

// troupe-bench sends the field and reports the acceptance rate and tokens per step.
TEST_F(speculative_wire, the_bench_reports_acceptance_and_tokens_per_step) {
  if (!fs::exists(bench_binary)) GTEST_SKIP() << "no troupe-bench at " << bench_binary;
  serve_process server({"--http-port", "0", "--served-model-name", "stories260K"});
  const fs::path out = fs::temp_directory_path() / ("troupe-spec-bench-" + std::to_string(::getpid()) + ".json");
  for (const std::string& target :
       {"--backend troupe-zmq --endpoint " + server.endpoint(),
        "--backend openai --base-url http://127.0.0.1:" + std::to_string(server.http_port())}) {
    const run_result run = run_command(shell_quote(bench_binary.string()) + " " + target +
                                       " --num-prompts 4 --input-len 16 --output-len 64 --concurrency 2"
                                       " --num-speculative-tokens 4 --tokenizer " +
                                       shell_quote(stories_dir) + " --json " + shell_quote(out.string()));
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("Draft acceptance rate (%):"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("Mean tokens per step:"), std::string::npos) << run.out;
    const json result = json::parse(read_file(out), nullptr, false);
    ASSERT_TRUE(result.contains("summary")) << read_file(out);
    const json& s = result["summary"];
    EXPECT_EQ(s["num_completed"], 4) << s["errors"].dump();
    ASSERT_TRUE(s.contains("speculative")) << s.dump();
    EXPECT_GT(s["speculative"]["draft_tokens"].get<int>(), 0);
    EXPECT_GE(s["speculative"]["mean_tokens_per_step"].get<double>(), 1.0);
    EXPECT_LE(s["speculative"]["acceptance_rate"].get<double>(), 1.0);
  }
  fs::remove(out);
}

}  // namespace
}  // namespace troupe::test
