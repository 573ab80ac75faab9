#pragma once
// vLLM's POST /tokenize and POST /detokenize, and GET /version, in vLLM's shapes:
//
//   /tokenize   {prompt, add_special_tokens = true, return_token_strs = false}, or a chat:
//               {messages, add_generation_prompt = true, add_special_tokens = false, tools,
//               chat_template_kwargs, return_token_strs}
//               -> {count, max_model_len, tokens, token_strs (null unless asked)}
//   /detokenize {tokens} -> {prompt}
//   /version    -> {version}
//
// A chat is rendered as /v1/chat/completions renders it (chat_prompt), so the count is what a
// chat request's prompt will hold. `model`, when given, must be the served name.

#include <string>
#include <string_view>
#include <variant>

#include "doors/http/api_error.hpp"
#include "doors/http/openai_request.hpp"
#include "text/chat_format.hpp"
#include "text/chat_prompt.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

struct tokenize_context {
  const tokenizer& tok;
  const chat_prompt& prompt;
  chat_format format;
  std::string model_name;
  openai_limits limits;
};

// The response body, or the error to answer.
std::variant<std::string, api_error> tokenize_response(std::string_view body, const tokenize_context& context);
std::variant<std::string, api_error> detokenize_response(std::string_view body, const tokenize_context& context);
std::string version_response();

}  // namespace troupe
