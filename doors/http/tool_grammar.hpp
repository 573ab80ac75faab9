#pragma once
// The grammar of a chat's answer, as one regular expression (grammar/regex.hpp's dialect) the
// whole output must match: the reasoning the model may write first, then either the tool calls it
// must make, in its family's syntax (text/chat_format.hpp), with each call's arguments following
// that function's JSON schema, or (tool_choice "auto") text that holds no call at all. So a call
// that is made always parses and validates, on any weights; structured output (response_format)
// applies to the answer after the reasoning the same way.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "doors/http/chat_request.hpp"
#include "text/chat_format.hpp"

namespace troupe {

struct answer_shape {
  chat_format format;
  // Reasoning before the answer: none, optional (the model may think), or already open (the
  // prompt ended inside <think>: the output must close it).
  enum class reasoning { none, optional, open };
  reasoning thinking = reasoning::none;
  std::vector<const chat_tool*> callable;  // the tools a call may name (empty: no calls)
  bool calls_required = false;             // required / a named function: no text instead
  bool parallel = true;                    // more than one call
  // What text the answer may be when it calls nothing: any text that holds no call marker, or
  // (structured output) this regex.
  std::optional<std::string> text_regex;
};

// Throws grammar_error naming the tool ("tools[2].function.parameters: $.properties.x: ...")
// when a schema cannot be compiled. `tool_index` maps callable[i] to its place in `tools`.
std::string answer_regex(const answer_shape& shape, const std::vector<size_t>& tool_index);

// Any text that does not contain `literal` (whose first character must not occur again in it:
// every marker used here is so). Exposed for tests.
std::string regex_avoiding(std::string_view literal);

}  // namespace troupe
