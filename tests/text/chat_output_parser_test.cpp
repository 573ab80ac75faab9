// A model's output split into reasoning, content and tool calls, family by family: what each
// syntax becomes, what is left as content when it does not parse, and that any split of the text
// into streamed pieces gives the same result as the whole text at once.

#include <gtest/gtest.h>

#include <random>

#include "text/chat_output_parser.hpp"

namespace troupe {
namespace {

output_parsing parsing(tool_call_syntax tools, reasoning_syntax reasoning = reasoning_syntax::none,
                       bool starts_in_reasoning = false) {
  output_parsing p;
  p.format.tools = tools;
  p.format.reasoning = reasoning;
  p.parse_tool_calls = tools != tool_call_syntax::none;
  p.starts_in_reasoning = starts_in_reasoning;
  return p;
}

parsed_output whole(const output_parsing& how, const std::string& text) {
  chat_output_parser parser(how);
  parsed_output out = parser.push(text);
  out.append(parser.finish());
  return out;
}

// The text in pieces cut at random places (also inside markers and UTF-8 sequences).
parsed_output streamed(const output_parsing& how, const std::string& text, uint32_t seed) {
  std::mt19937 rng(seed);
  chat_output_parser parser(how);
  parsed_output out;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(text.size() - at, static_cast<size_t>(rng() % 5));
    out.append(parser.push(text.substr(at, n)));
    at += n;
  }
  out.append(parser.finish());
  return out;
}

void expect_same(const parsed_output& a, const parsed_output& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

struct parse_case {
  const char* label;
  output_parsing how;
  std::string text;
  std::string reasoning;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

std::vector<parse_case> cases() {
  using tc = tool_call_syntax;
  using rs = reasoning_syntax;
  return {
      {"hermes one call",
       parsing(tc::hermes),
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"unit\": "
       "\"celsius\"}}\n</tool_call>",
       "",
       "",
       {{"get_weather", R"({"location":"Paris","unit":"celsius"})"}}},
      {"hermes text then two calls",
       parsing(tc::hermes),
       "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
       "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
       "",
       "Let me check both.",
       {{"a", "{}"}, {"b", R"({"x":1})"}}},
      {"hermes broken json stays text",
       parsing(tc::hermes),
       "<tool_call>\n{\"name\": oops}\n</tool_call> end",
       "",
       "<tool_call>\n{\"name\": oops}\n</tool_call> end",
       {}},
      {"hermes call cut before its closing tag",
       parsing(tc::hermes),
       "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": [1, 2]}}",
       "",
       "",
       {{"a", R"({"k":[1,2]})"}}},
      {"hermes plain text keeps its blanks",
       parsing(tc::hermes),
       "  Hello <tool world >\n",
       "",
       "  Hello <tool world >\n",
       {}},
      {"qwen3 thinking then a call",
       parsing(tc::hermes, rs::think),
       "<think>\nI should look it up.\n</think>\n\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": "
       "\"é\"}}\n</tool_call>",
       "I should look it up.\n",
       "",
       {{"search", R"({"query":"é"})"}}},
      {"qwen3 thinking then text",
       parsing(tc::none, rs::think),
       "<think>\nHmm.\n</think>\n\nThe answer is 4.",
       "Hmm.\n",
       "The answer is 4.",
       {}},
      {"no think tag: all content",
       parsing(tc::none, rs::think),
       "Just text <think> in the middle",
       "",
       "Just text <think> in the middle",
       {}},
      {"deepseek: the prompt opened <think>",
       parsing(tc::none, rs::think, true),
       "Okay, 2+2.\n</think>\n\n4",
       "Okay, 2+2.\n",
       "4",
       {}},
      {"cut off while thinking", parsing(tc::none, rs::think), "<think>\nstill going", "still going", "", {}},
      {"mistral v3 array",
       parsing(tc::mistral),
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}, {\"name\": \"search\", "
       "\"arguments\": {\"query\": \"x\"}}]",
       "",
       "",
       {{"get_weather", R"({"location":"Paris"})"}, {"search", R"({"query":"x"})"}}},
      {"mistral v11 name[ARGS]",
       parsing(tc::mistral),
       "Sure. [TOOL_CALLS]get_weather[ARGS]{\"location\": \"Rome\"}",
       "",
       "Sure.",
       {{"get_weather", R"({"location":"Rome"})"}}},
      {"mistral broken", parsing(tc::mistral), "[TOOL_CALLS][{\"name\": ", "", "[TOOL_CALLS][{\"name\": ", {}},
      {"llama3 json",
       parsing(tc::llama3_json),
       "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Oslo\"}}",
       "",
       "",
       {{"get_weather", R"({"location":"Oslo"})"}}},
      {"llama3 python_tag and two calls",
       parsing(tc::llama3_json),
       "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": 2}}",
       "",
       "",
       {{"a", "{}"}, {"b", R"({"n":2})"}}},
      {"llama3 text", parsing(tc::llama3_json), "The weather is {nice} today.", "", "The weather is {nice} today.", {}},
      {"llama3 json that is no call", parsing(tc::llama3_json), "{\"answer\": 42}", "", "{\"answer\": 42}", {}},
      {"harmony analysis then final",
       parsing(tc::harmony, rs::harmony),
       "<|channel|>analysis<|message|>User wants a joke.<|end|><|start|>assistant<|channel|>final<|message|>Why not?",
       "User wants a joke.",
       "Why not?",
       {}},
      {"harmony analysis then a call",
       parsing(tc::harmony, rs::harmony),
       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather "
       "<|constrain|>json<|message|>{\"location\":\"SF\"}",
       "Need weather.",
       "",
       {{"get_weather", R"({"location":"SF"})"}}},
      {"harmony call with the recipient first",
       parsing(tc::harmony, rs::harmony),
       " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"q\"}<|call|>",
       "",
       "",
       {{"search", R"({"query":"q"})"}}},
      {"harmony without structure is content", parsing(tc::harmony, rs::harmony), "hello there", "", "hello there", {}},
  };
}

TEST(chat_output_parser, each_family_splits_reasoning_content_and_calls) {
  for (const auto& c : cases()) {
    const parsed_output out = whole(c.how, c.text);
    EXPECT_EQ(out.reasoning, c.reasoning) << c.label;
    EXPECT_EQ(out.content, c.content) << c.label;
    ASSERT_EQ(out.tool_calls.size(), c.calls.size()) << c.label;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(out.tool_calls[i].name, c.calls[i].first) << c.label;
      EXPECT_EQ(out.tool_calls[i].arguments, c.calls[i].second) << c.label;
    }
  }
}

TEST(chat_output_parser, streamed_pieces_reassemble_to_the_whole) {
  for (const auto& c : cases()) {
    const parsed_output expected = whole(c.how, c.text);
    for (uint32_t seed = 0; seed < 40; ++seed)
      expect_same(streamed(c.how, c.text, seed), expected, std::string(c.label) + " seed " + std::to_string(seed));
    // One byte at a time too.
    chat_output_parser parser(c.how);
    parsed_output bytewise;
    for (char ch : c.text) bytewise.append(parser.push(std::string(1, ch)));
    bytewise.append(parser.finish());
    expect_same(bytewise, expected, std::string(c.label) + " byte by byte");
  }
}

TEST(chat_output_parser, text_is_released_as_soon_as_no_marker_can_begin) {
  chat_output_parser parser(parsing(tool_call_syntax::hermes, reasoning_syntax::think));
  // Nothing yet: "<thi" may still become <think>.
  EXPECT_TRUE(parser.push("<thi").empty());
  parsed_output a = parser.push("nk>abc");
  EXPECT_EQ(a.reasoning, "abc");
  parsed_output b = parser.push("</th");
  EXPECT_TRUE(b.empty());
  parsed_output c = parser.push("ink>Hello <tool");
  EXPECT_EQ(c.content, "Hello");  // the blank and "<tool" wait: they may begin a call
  parsed_output d = parser.push("box>");
  EXPECT_EQ(d.content, " <toolbox>");
}

TEST(chat_output_parser, reasoning_off_leaves_think_in_the_content) {
  output_parsing how = parsing(tool_call_syntax::none, reasoning_syntax::think);
  how.parse_reasoning = false;
  EXPECT_EQ(whole(how, "<think>x</think>y").content, "<think>x</think>y");
}

}  // namespace
}  // namespace troupe
