#pragma once
// A model's raw output text, split the way chat APIs return it: the reasoning (`<think>...</think>`
// or harmony's analysis channel), the answer's content, and the tool calls written in the syntax
// of the model's family (text/chat_format.hpp).
//
// Incremental: text comes in as it is generated, and each push returns what has become final; a
// tail that a marker could still begin is held back, and so is a tool call until it is whole.
// Pushing a text whole or in any pieces gives the same pieces in total, which is what makes a
// streamed answer reassemble to the unstreamed one. Text that does not parse as what it began to
// look like (a tool call whose JSON is broken) is returned as content, never dropped.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_format.hpp"

namespace troupe {

struct parsed_tool_call {
  std::string name;
  std::string arguments;  // a JSON object, compact, keys in the model's order
};

struct parsed_output {
  std::string reasoning;
  std::string content;
  std::vector<parsed_tool_call> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(parsed_output&& more);
};

struct output_parsing {
  chat_format format;
  bool parse_tool_calls = false;     // tools were offered and may be called
  bool parse_reasoning = true;       // split the reasoning off (else it stays in the content)
  bool starts_in_reasoning = false;  // the prompt ended inside <think>: the output begins as reasoning
};

class chat_output_parser {
 public:
  explicit chat_output_parser(output_parsing how);
  ~chat_output_parser();
  chat_output_parser(chat_output_parser&&) noexcept;
  chat_output_parser& operator=(chat_output_parser&&) noexcept;

  parsed_output push(std::string_view text);
  // The output has ended: whatever is held is decided (an unclosed call is parsed as it stands).
  parsed_output finish();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// {"name": ..., "arguments" or "parameters": {...} or its JSON text}, as every family but harmony
// writes a call; nothing when `json_text` is not such an object.
std::optional<parsed_tool_call> tool_call_from_json(std::string_view json_text);

}  // namespace troupe
