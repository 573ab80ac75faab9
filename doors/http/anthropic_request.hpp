#pragma once
// The body of Anthropic's POST /v1/messages, parsed and checked into the request the HTTP door
// serves (openai_request.hpp, endpoint anthropic_messages): the system prompt and the messages in
// the shape chat templates read (tool_use blocks become an assistant's tool_calls, tool_result
// blocks tool messages, thinking blocks its reasoning_content), the tools and tool_choice, the
// sampling fields (max_tokens, temperature, top_p, top_k, stop_sequences), `thinking` as the
// template's switch. Every problem is a 400 naming the field; unknown fields are ignored and
// listed, as on OpenAI's endpoints.

#include <string_view>
#include <variant>

#include "doors/http/api_error.hpp"
#include "doors/http/openai_request.hpp"

namespace troupe {

std::variant<openai_request, api_error> parse_anthropic_request(std::string_view body, const openai_limits& limits);

}  // namespace troupe
