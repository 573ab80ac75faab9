#pragma once
// What a door does with a chat before the engine sees it, and how it reads the answer back: the
// prompt rendered with the model's chat template (messages, tools, chat_template_kwargs,
// reasoning_effort), whether the text must keep special tokens (the markers some families write
// calls and channels in), the grammar that enforces the tool calls and any structured output
// after the reasoning (tool_grammar.hpp), and how the output splits into reasoning, content and
// tool calls (text/chat_output_parser.hpp).

#include <cstdint>
#include <string>

#include "doors/http/chat_request.hpp"
#include "protocol/sampling_params.hpp"
#include "text/chat_format.hpp"
#include "text/chat_output_parser.hpp"
#include "text/chat_prompt.hpp"

namespace troupe {

struct chat_plan {
  std::string prompt;  // the rendered chat
  output_parsing parsing;
  bool skip_special_tokens = true;
  guided_decoding guided;    // kind none: unconstrained
  std::string guided_param;  // the field a problem with `guided` is reported under
  std::string note;          // why a grammar was left out (for the log), else empty
};

// The request's fault, in terms of its own fields.
struct chat_plan_error {
  std::string param;
  std::string message;
};

// asked: the request's own structured output (response_format / guided_*), asked_param its field.
// Throws chat_plan_error naming the field (a template that refuses the messages, a tool whose
// schema cannot be enforced, a required call the model's family has no syntax for).
chat_plan plan_chat(const chat_request& chat, const chat_prompt& prompt, const chat_format& format,
                    const guided_decoding& asked, const std::string& asked_param);

// The id of the index-th call of an answer, as the family's template accepts it back in the next
// turn: Mistral's must be 9 letters or digits; others get OpenAI's "call_..." form. `seed` makes
// them unique (the request's id and choice).
std::string tool_call_id(tool_call_syntax syntax, uint64_t seed, int index);

}  // namespace troupe
