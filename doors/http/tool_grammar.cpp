#include "doors/http/tool_grammar.hpp"

#include <cstdio>

#include "grammar/grammar_error.hpp"
#include "grammar/json_schema_regex.hpp"
#include "grammar/regex.hpp"

namespace troupe {

namespace {

// One character as a class member (always a hex escape: nothing in it can mean anything).
std::string member(char c) {
  char text[8];
  std::snprintf(text, sizeof text, "\\x%02X", static_cast<unsigned char>(c));
  return text;
}

std::string literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += regex_escape(std::string_view(&c, 1));
    }
  }
  return out;
}

constexpr std::string_view any_text = "[\\s\\S]*";
constexpr std::string_view blanks = "[ \\t\\r\\n]*";

// Text that begins like `lit` but leaves it before its end (or stops short of it).
std::string deviating(std::string_view lit) {
  // s0 (?: | [^s1] ANY | s1 (?: | [^s2] ANY | s2 (...)))
  std::string out = literal(lit.substr(0, 1));
  std::string tail;
  for (size_t k = lit.size() - 1; k >= 1; --k) {
    const std::string next = "[^" + member(lit[k]) + "]" + std::string(any_text);
    tail = k == lit.size() - 1 ? "(?:|" + next + ")" : "(?:|" + next + "|" + literal(lit.substr(k, 1)) + tail + ")";
  }
  return out + tail;
}

// The arguments' regex of one tool: its schema's, or any object for a tool without one.
std::string arguments_regex(const chat_tool& tool, const std::string& where) {
  const auto& p = tool.parameters;
  const bool any_object = p.empty() || (!p.contains("properties") && !p.contains("type") && !p.contains("$ref") &&
                                        !p.contains("anyOf") && !p.contains("oneOf"));
  if (any_object) return json_object_regex();
  try {
    return json_schema_to_regex(p);
  } catch (const grammar_error& e) {
    throw grammar_error(where + ": " + e.what());
  }
}

// The calls one output may make, each naming one of `callable` with arguments of its schema.
std::string call_regex(const answer_shape& shape, const std::vector<size_t>& tool_index) {
  std::string alternatives;
  for (size_t i = 0; i < shape.callable.size(); ++i) {
    const chat_tool& tool = *shape.callable[i];
    const std::string args =
        arguments_regex(tool, "tools[" + std::to_string(tool_index.at(i)) + "].function.parameters");
    std::string one;
    switch (shape.format.tools) {
      case tool_call_syntax::hermes:
        one = literal("<tool_call>\n{\"name\": \"" + tool.name + "\", \"arguments\": ") + "(?:" + args + ")" +
              literal("}\n</tool_call>");
        break;
      case tool_call_syntax::mistral:
      case tool_call_syntax::none:
        one = literal("{\"name\": \"" + tool.name + "\", \"arguments\": ") + "(?:" + args + ")" + literal("}");
        break;
      case tool_call_syntax::llama3_json:
        one = literal("{\"name\": \"" + tool.name + "\", \"parameters\": ") + "(?:" + args + ")" + literal("}");
        break;
      case tool_call_syntax::harmony:
        one = literal("<|channel|>commentary to=functions." + tool.name + " <|constrain|>json<|message|>") +
              "(?:" + args + ")";
        break;
    }
    alternatives += (alternatives.empty() ? "" : "|") + one;
  }
  const std::string call = "(?:" + alternatives + ")";
  // gpt-oss ends a call with <|call|>, an end token, and Llama 3.1's template refuses an earlier
  // turn with more than one call: one call per output for both.
  const bool parallel = shape.parallel && shape.format.tools != tool_call_syntax::harmony &&
                        shape.format.tools != tool_call_syntax::llama3_json;
  switch (shape.format.tools) {
    case tool_call_syntax::hermes: return call + (parallel ? "(?:\\n" + call + ")*" : "");
    case tool_call_syntax::mistral:
    case tool_call_syntax::none:
      return literal("[TOOL_CALLS][") + call + (parallel ? "(?:, " + call + ")*" : "") + literal("]");
    case tool_call_syntax::llama3_json: return call + (parallel ? "(?:; " + call + ")*" : "");
    case tool_call_syntax::harmony: return call;
  }
  return call;
}

// Text with no call in it, in the family's terms (what its parser would not read as a call).
std::string text_without_calls(tool_call_syntax syntax) {
  switch (syntax) {
    case tool_call_syntax::hermes: return regex_avoiding("<tool_call>");
    case tool_call_syntax::mistral: return regex_avoiding("[TOOL_CALLS]");
    case tool_call_syntax::llama3_json:
      // A Llama reply is a call when it begins (after blanks) with '{' or <|python_tag|>.
      return std::string(blanks) + "(?:|[^ \\t\\r\\n{<]" + std::string(any_text) + "|" + deviating("<|python_tag|>") +
             ")";
    case tool_call_syntax::harmony:
    case tool_call_syntax::none: break;
  }
  return std::string(any_text);
}

}  // namespace

std::string regex_avoiding(std::string_view lit) {
  if (lit.size() < 2 || lit.substr(1).find(lit[0]) != std::string_view::npos) {
    throw grammar_error("regex_avoiding: \"" + std::string(lit) +
                        "\" must be 2 characters or more, its first one unrepeated");
  }
  // The automaton that finds `lit`, as a regex: state k has matched lit[0, k). From any state,
  // lit[0] leads to state 1; from state k >= 1, lit[k] to k + 1 (never to the end), anything else
  // back to 0. With state 1 as the hub:
  //   loop  = (lit[1..k) lit[0]) for k < n - 1: from state 1 back to state 1
  //   exit  = lit[1..k) [^lit[k] lit[0]]:         from state 1 back to state 0
  //   text  = ([^lit0] | lit0 loop* exit)* (lit0 loop* lit[1..k))?
  const size_t n = lit.size();
  const std::string s0 = literal(lit.substr(0, 1));
  std::string prefixes;  // (?:lit1(?:lit2(...)?)?)? : lit[1..k) for k = 1 .. n - 1
  for (size_t k = n - 2; k >= 1; --k) prefixes = "(?:" + literal(lit.substr(k, 1)) + prefixes + ")?";
  std::string exits;  // [^lit1 lit0] | lit1 ([^lit2 lit0] | lit2 (...))
  for (size_t k = n - 1; k >= 1; --k) {
    const std::string leave = "[^" + member(lit[k]) + member(lit[0]) + "]";
    exits = k == n - 1 ? leave : "(?:" + leave + "|" + literal(lit.substr(k, 1)) + exits + ")";
  }
  const std::string loop = "(?:" + prefixes + s0 + ")*";
  return "(?:[^" + member(lit[0]) + "]|" + s0 + loop + exits + ")*(?:" + s0 + loop + prefixes + ")?";
}

std::string answer_regex(const answer_shape& shape, const std::vector<size_t>& tool_index) {
  std::string prefix;
  const bool harmony =
      shape.format.reasoning == reasoning_syntax::harmony || shape.format.tools == tool_call_syntax::harmony;
  if (harmony) {
    // gpt-oss: an analysis message may come first; no message may contain the markers' "<|".
    prefix = "(?:" + literal("<|channel|>analysis<|message|>") + regex_avoiding("<|") +
             literal("<|end|><|start|>assistant") + ")?";
  } else if (shape.thinking == answer_shape::reasoning::open) {
    prefix = regex_avoiding("</think>") + literal("</think>") + std::string(blanks);
  } else if (shape.thinking == answer_shape::reasoning::optional) {
    prefix = "(?:" + literal("<think>") + regex_avoiding("</think>") + literal("</think>") + std::string(blanks) + ")?";
  }
  std::string text;
  if (!shape.calls_required) {
    if (harmony) {
      text = literal("<|channel|>final<|message|>") +
             (shape.text_regex ? "(?:" + *shape.text_regex + ")" : regex_avoiding("<|"));
    } else {
      text = shape.text_regex ? *shape.text_regex : text_without_calls(shape.format.tools);
    }
  }
  std::string answer;
  if (shape.callable.empty()) {
    answer = text;
  } else {
    const std::string calls = call_regex(shape, tool_index);
    answer = shape.calls_required ? calls : "(?:" + text + "|" + calls + ")";
  }
  return prefix + "(?:" + answer + ")";
}

}  // namespace troupe
