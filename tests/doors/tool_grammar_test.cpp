// The grammar of a chat's answer (doors/http/tool_grammar.hpp), compiled into the byte automaton
// the sampler follows: text avoiding a marker is exactly the text that does not contain it; every
// output the grammar allows, sampled by random walks, parses (text/chat_output_parser.hpp) into
// calls of the offered tools with arguments of their schema's shape; what a template shows the
// model as a call is allowed; required calls leave no room for text.

#include <gtest/gtest.h>

#include <random>

#include "doors/http/tool_grammar.hpp"
#include "grammar/byte_dfa.hpp"
#include "text/chat_output_parser.hpp"

namespace troupe {
namespace {

using ojson = nlohmann::ordered_json;

TEST(tool_grammar, text_avoiding_a_marker_is_text_without_it) {
  std::mt19937 rng(7);
  for (std::string marker : {"<tool_call>", "</think>", "[TOOL_CALLS]", "<|", "<|python_tag|>", "ab"}) {
    const byte_dfa dfa = byte_dfa::compile(regex_avoiding(marker));
    // Strings over the marker's own characters (and one more), where near misses abound.
    std::string alphabet = marker + "x\n";
    for (int i = 0; i < 4000; ++i) {
      std::string s;
      const size_t n = rng() % 24;
      for (size_t k = 0; k < n; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
      if (rng() % 4 == 0) s.insert(rng() % (s.size() + 1), marker);
      EXPECT_EQ(dfa.matches(s), s.find(marker) == std::string::npos) << marker << " on \"" << s << "\"";
    }
    EXPECT_TRUE(dfa.matches("é ü 漢字 " + marker.substr(0, marker.size() - 1)));
  }
  EXPECT_THROW(regex_avoiding("aba"), std::exception);  // its first character comes back
}

std::vector<chat_tool> weather_tools() {
  chat_tool weather;
  weather.name = "get_weather";
  weather.parameters =
      ojson::parse(R"({"type": "object", "properties": {"location": {"type": "string", "maxLength": 12},
      "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["location"], "additionalProperties": false})");
  chat_tool search;
  search.name = "search";
  search.parameters = ojson::parse(R"({"type": "object", "properties": {"query": {"type": "string"},
      "limit": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["query", "limit"]})");
  chat_tool ping;  // no parameters: any object
  ping.name = "ping";
  return {weather, search, ping};
}

// A random output the automaton accepts, after `prefix` (which it must allow): a walk that stops
// at accepting states now and then and, past `soft_limit` bytes, heads for acceptance by the
// shortest way.
std::string random_output(const byte_dfa& dfa, std::mt19937& rng, size_t soft_limit, const std::string& prefix = {}) {
  std::string out = prefix;
  int32_t state = dfa.walk(dfa.start(), prefix);
  if (state == byte_dfa::dead) {
    ADD_FAILURE() << "the grammar refuses the prefix " << prefix;
    return out;
  }
  for (;;) {
    if (dfa.accepting(state) && (rng() % 8 == 0 || !dfa.has_transitions(state) || out.size() > soft_limit * 3))
      return out;
    std::vector<uint8_t> options;
    for (int b = 0; b < 256; ++b) {
      const int32_t next = dfa.next(state, static_cast<uint8_t>(b));
      if (next == byte_dfa::dead) continue;
      if (out.size() > soft_limit && dfa.distance(next) >= dfa.distance(state)) continue;
      options.push_back(static_cast<uint8_t>(b));
    }
    if (options.empty()) return out;
    const uint8_t b = options[rng() % options.size()];
    out.push_back(static_cast<char>(b));
    state = dfa.next(state, b);
  }
}

output_parsing parsing_for(const chat_format& f) {
  output_parsing p;
  p.format = f;
  p.parse_tool_calls = true;
  return p;
}

parsed_output parse(const chat_format& f, const std::string& text, bool starts_in_reasoning = false) {
  output_parsing p = parsing_for(f);
  p.starts_in_reasoning = starts_in_reasoning;
  chat_output_parser parser(p);
  parsed_output out = parser.push(text);
  out.append(parser.finish());
  return out;
}

// The arguments of a call are an object of the tool's shape: for these schemas, only their
// properties, the required ones present, of the right JSON types.
void expect_valid_call(const parsed_tool_call& call, const std::vector<chat_tool>& tools, const std::string& text) {
  const chat_tool* tool = nullptr;
  for (const auto& t : tools) tool = t.name == call.name ? &t : tool;
  ASSERT_NE(tool, nullptr) << "a call of an unknown tool in: " << text;
  const ojson args = ojson::parse(call.arguments);
  ASSERT_TRUE(args.is_object()) << text;
  if (!tool->parameters.contains("properties")) return;
  for (const auto& required : tool->parameters["required"])
    EXPECT_TRUE(args.contains(required.get<std::string>())) << text;
  for (auto it = args.begin(); it != args.end(); ++it) {
    ASSERT_TRUE(tool->parameters["properties"].contains(it.key())) << it.key() << " in " << text;
    const auto& schema = tool->parameters["properties"][it.key()];
    if (schema.value("type", "") == "string") {
      EXPECT_TRUE(it->is_string()) << text;
    }
    if (schema.value("type", "") == "integer") {
      EXPECT_TRUE(it->is_number_integer() && *it >= 1 && *it <= 5) << text;
    }
    if (schema.contains("enum")) {
      EXPECT_TRUE(*it == "celsius" || *it == "fahrenheit") << text;
    }
    if (schema.contains("maxLength")) {
      EXPECT_LE(it->get<std::string>().size(), 12u * 4) << text;
    }
  }
}

struct family {
  const char* name;
  chat_format format;
  std::string call_opening;  // what a call begins with, once text could have begun instead
};

std::vector<family> families() {
  return {{"hermes", {tool_call_syntax::hermes, reasoning_syntax::none}, "<tool_call>"},
          {"qwen3", {tool_call_syntax::hermes, reasoning_syntax::think}, "<tool_call>"},
          {"mistral", {tool_call_syntax::mistral, reasoning_syntax::none}, "[TOOL_CALLS]"},
          {"llama3_json", {tool_call_syntax::llama3_json, reasoning_syntax::none}, "{"},
          {"harmony", {tool_call_syntax::harmony, reasoning_syntax::harmony}, "<|channel|>commentary"}};
}

TEST(tool_grammar, every_output_a_required_grammar_allows_parses_into_valid_calls) {
  const auto tools = weather_tools();
  std::mt19937 rng(11);
  for (const auto& f : families()) {
    answer_shape shape;
    shape.format = f.format;
    if (f.format.reasoning == reasoning_syntax::think) shape.thinking = answer_shape::reasoning::optional;
    for (const auto& t : tools) shape.callable.push_back(&t);
    shape.calls_required = true;
    const byte_dfa dfa = byte_dfa::compile(answer_regex(shape, {0, 1, 2}));
    for (int i = 0; i < 300; ++i) {
      const std::string text = random_output(dfa, rng, 60);
      const parsed_output out = parse(f.format, text);
      ASSERT_FALSE(out.tool_calls.empty()) << f.name << ": no call in " << text;
      EXPECT_TRUE(out.content.empty()) << f.name << ": " << text;
      for (const auto& call : out.tool_calls) expect_valid_call(call, tools, text);
    }
  }
}

TEST(tool_grammar, auto_allows_text_or_valid_calls_and_nothing_between) {
  const auto tools = weather_tools();
  std::mt19937 rng(12);
  for (const auto& f : families()) {
    answer_shape shape;
    shape.format = f.format;
    for (const auto& t : tools) shape.callable.push_back(&t);
    const byte_dfa dfa = byte_dfa::compile(answer_regex(shape, {0, 1, 2}));
    // From the start a random walk almost never spells a call's opening: it writes text, which
    // must never hold a call the parser would read.
    for (int i = 0; i < 300; ++i) {
      const std::string text = random_output(dfa, rng, 40);
      const parsed_output out = parse(f.format, text);
      for (const auto& call : out.tool_calls) expect_valid_call(call, tools, text);
    }
    // Once a call has begun, it ends as valid calls and nothing else.
    for (int i = 0; i < 200; ++i) {
      const std::string text = random_output(dfa, rng, 60, f.call_opening);
      const parsed_output out = parse(f.format, text);
      ASSERT_FALSE(out.tool_calls.empty()) << f.name << ": no call in " << text;
      EXPECT_TRUE(out.content.empty()) << f.name << ": " << text;
      for (const auto& call : out.tool_calls) expect_valid_call(call, tools, text);
    }
  }
}

TEST(tool_grammar, calls_as_the_templates_show_them_are_allowed_and_text_only_when_asked) {
  const auto tools = weather_tools();
  struct example {
    chat_format format;
    std::string call;  // one call, as the family's template writes it
    std::string text;  // a plain answer
  };
  const std::vector<example> examples = {
      {{tool_call_syntax::hermes, reasoning_syntax::none},
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
       "{\"location\":\"Paris\",\"unit\":\"celsius\"}}\n</tool_call>",
       "It is sunny."},
      {{tool_call_syntax::mistral, reasoning_syntax::none},
       "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\":\"x\",\"limit\":3}}]",
       "Bonjour."},
      {{tool_call_syntax::llama3_json, reasoning_syntax::none},
       "{\"name\": \"ping\", \"parameters\": {}}",
       "Hello {x}"},
      {{tool_call_syntax::harmony, reasoning_syntax::harmony},
       "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
       "<|constrain|>json<|message|>{\"location\":\"Rome\"}",
       "<|channel|>final<|message|>Hi!"},
  };
  for (const auto& e : examples) {
    answer_shape shape;
    shape.format = e.format;
    for (const auto& t : tools) shape.callable.push_back(&t);
    const byte_dfa automatic = byte_dfa::compile(answer_regex(shape, {0, 1, 2}));
    shape.calls_required = true;
    const byte_dfa required = byte_dfa::compile(answer_regex(shape, {0, 1, 2}));
    EXPECT_TRUE(automatic.matches(e.call)) << e.call;
    EXPECT_TRUE(required.matches(e.call)) << e.call;
    EXPECT_TRUE(automatic.matches(e.text)) << e.text;
    EXPECT_FALSE(required.matches(e.text)) << e.text;
    // A call of a tool that was not offered, or with arguments off its schema, is not.
    std::string unknown = e.call;
    for (const char* name : {"get_weather", "search", "ping"}) {
      if (const size_t at = unknown.find(name); at != std::string::npos)
        unknown.replace(at, std::string(name).size(), "rm_rf");
    }
    EXPECT_FALSE(automatic.matches(unknown)) << unknown;
  }
}

TEST(tool_grammar, reasoning_comes_first_and_structured_output_after_it) {
  answer_shape shape;
  shape.format = {tool_call_syntax::hermes, reasoning_syntax::think};
  shape.thinking = answer_shape::reasoning::optional;
  shape.text_regex = R"(\{"ok":(?:true|false)\})";
  const byte_dfa optional = byte_dfa::compile(answer_regex(shape, {}));
  EXPECT_TRUE(optional.matches("<think>\nfine, <b>\n</think>\n\n{\"ok\":true}"));
  EXPECT_TRUE(optional.matches("{\"ok\":false}"));
  EXPECT_FALSE(optional.matches("<think>x</think>not json"));
  EXPECT_FALSE(optional.matches("<think>x</think>{\"ok\":true}</think>"));
  shape.thinking = answer_shape::reasoning::open;  // the prompt opened <think>
  const byte_dfa open = byte_dfa::compile(answer_regex(shape, {}));
  EXPECT_TRUE(open.matches("so: yes.</think>\n{\"ok\":true}"));
  EXPECT_FALSE(open.matches("{\"ok\":true}"));
}

TEST(tool_grammar, a_schema_it_cannot_enforce_is_named_by_its_tool) {
  chat_tool bad;
  bad.name = "bad";
  bad.parameters =
      ojson::parse(R"({"type": "object", "properties": {"x": {"type": "string", "not": {"const": "y"}}}})");
  answer_shape shape;
  shape.format = {tool_call_syntax::hermes, reasoning_syntax::none};
  shape.callable.push_back(&bad);
  try {
    (void)answer_regex(shape, {3});
    FAIL() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("tools[3].function.parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
