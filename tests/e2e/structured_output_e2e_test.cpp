// Structured output through the real server: the official `openai` npm client asks
// /v1/chat/completions for response_format json_schema (strict) and json_object, and
// /v1/completions for guided_choice / guided_regex (vLLM's extra fields), on stories260K; every
// output is judged by ajv / JavaScript's RegExp. A schema that cannot be compiled is a 400
// naming response_format, a bad regex over ZeroMQ a bad_request, and the server keeps serving.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"
#include "tests/engine/structured_oracle.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const json person_schema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "mood": {"enum": ["happy", "sad", "sleepy"]},
    "friends": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z][a-z]+$"}, "maxItems": 3},
    "home": {"type": "object", "properties": {"town": {"type": "string"}, "zip": {"type": "string", "format": "date"}},
             "required": ["town"]}
  },
  "required": ["name", "age", "mood", "friends", "home"]
})");

// One `troupe serve` with both doors; the HTTP port read from its log.
struct structured_server {
  serve_process zmq;
  int http_port;

  structured_server() : zmq({"--http-port", "0", "--served-model-name", "stories260K"}), http_port(zmq.http_port()) {
    httplib::Client c("127.0.0.1", http_port);
    for (int i = 0; i < 100; ++i) {
      if (auto res = c.Get("/health"); res && res->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("the HTTP API did not come up on port " + std::to_string(http_port));
  }

  json openai(const json& requests) const {
    const json plan = {{"base_url", "http://127.0.0.1:" + std::to_string(http_port) + "/v1"},
                       {"requests", requests},
                       {"concurrent", true}};
    const std::string path =
        (fs::temp_directory_path() / ("troupe-structured-plan-" + std::to_string(::getpid()) + ".json")).string();
    std::ofstream(path) << plan.dump();
    const run_result node = run_command("node " TROUPE_ORACLE_DIR "/openai_client.mjs @" + path);
    fs::remove(path);
    try {
      return json::parse(node.out);
    } catch (const std::exception&) {
      ADD_FAILURE() << "openai_client.mjs printed no JSON: " << node.out << node.err;
      return json::array();
    }
  }
};

TEST(structured_output_e2e, openai_client_outputs_validate_and_bad_constraints_are_refused) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  if (!fs::exists(TROUPE_ORACLE_DIR "/node_modules/openai/package.json")) GTEST_SKIP() << "no openai npm package";
  if (const auto why = testing::structured_oracle_unavailable(); !why.empty()) GTEST_SKIP() << why;
  structured_server server;

  json requests = json::array();
  json expected = json::array();  // the oracle case each request's output must pass
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me about a girl."}}});
  for (int seed = 0; seed < 6; ++seed) {
    requests.push_back({{"api", "chat"},
                        {"params",
                         {{"model", "stories260K"},
                          {"messages", messages},
                          {"max_tokens", 200},
                          {"temperature", seed == 0 ? 0.0 : 1.0},
                          {"seed", seed},
                          {"response_format",
                           {{"type", "json_schema"},
                            {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", person_schema}}}}}}}});
    expected.push_back({{"kind", "schema"}, {"schema", person_schema}});
  }
  requests.push_back({{"api", "chat"},
                      {"params",
                       {{"model", "stories260K"},
                        {"messages", messages},
                        {"max_tokens", 60},
                        {"response_format", {{"type", "json_object"}}}}}});
  expected.push_back({{"kind", "schema"}, {"schema", {{"type", "object"}}}});
  const json choices = json::array({"once", "twice", "never again"});
  requests.push_back({{"api", "completions"},
                      {"params",
                       {{"model", "stories260K"},
                        {"prompt", "Once upon a time"},
                        {"max_tokens", 20},
                        {"temperature", 1.0},
                        {"guided_choice", choices}}}});
  expected.push_back({{"kind", "choice"}, {"choices", choices}});
  requests.push_back({{"api", "completions"},
                      {"params",
                       {{"model", "stories260K"},
                        {"prompt", "Once upon a time"},
                        {"max_tokens", 30},
                        {"temperature", 1.0},
                        {"guided_regex", "[A-Z][a-z]+ (is|was) [0-9]{1,3}"}}}});
  expected.push_back({{"kind", "regex"}, {"pattern", "[A-Z][a-z]+ (is|was) [0-9]{1,3}"}});

  const json results = server.openai(requests);
  ASSERT_EQ(results.size(), requests.size()) << results.dump();
  json cases = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i]["ok"].get<bool>()) << results[i].dump();
    const std::string text = results[i]["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(results[i]["choices"][0]["finish_reason"], "stop") << text;  // complete, not cut by the length
    json c = expected[i];
    c["output"] = text;
    cases.push_back(c);
  }
  std::string error;
  const auto verdicts = testing::run_structured_oracle(cases, error);
  ASSERT_TRUE(verdicts) << error;
  for (size_t i = 0; i < verdicts->size(); ++i) {
    EXPECT_TRUE((*verdicts)[i].ok) << (*verdicts)[i].why << ": " << cases[i].dump();
  }

  // Refusals name the part; the server keeps serving.
  httplib::Client http("127.0.0.1", server.http_port);
  http.set_read_timeout(60, 0);
  auto bad = http.Post("/v1/chat/completions", R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":
      {"a":{"type":"string","minLength":1,"not":{}}}}}}})",
                       "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  const json body = json::parse(bad->body);
  EXPECT_EQ(body["error"]["param"], "response_format") << bad->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("\"not\""), std::string::npos) << bad->body;

  client zmq_client(server.zmq.endpoint());
  generate_request regex = greedy("Once upon a time", 20);
  regex.sampling.guided = {guided_kind::regex, "(?<=x)y", {}};
  try {
    zmq_client.generate(regex);
    ADD_FAILURE() << "a lookbehind was accepted";
  } catch (const client_error& e) {
    EXPECT_EQ(e.code(), error_code::bad_request);
    EXPECT_NE(std::string(e.what()).find("guided_regex"), std::string::npos) << e.what();
  }
  generate_request choice = greedy("Once upon a time", 20);
  choice.sampling.guided = {guided_kind::choice, "", {"red", "green"}};
  const completion done = zmq_client.generate(choice);
  EXPECT_TRUE(done.text == "red" || done.text == "green") << done.text;
}

}  // namespace
}  // namespace troupe::test
