#pragma once
// The body of POST /v1/completions and POST /v1/chat/completions, parsed and checked. Every
// problem becomes a 400 api_error whose `param` names the field (OpenAI's shape); fields this
// server does not know are refused the same way, so a typo never passes silently.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "doors/http/api_error.hpp"
#include "protocol/protocol_limits.hpp"
#include "protocol/sampling_params.hpp"
#include "stages/messages.hpp"

namespace troupe {

enum class openai_endpoint { completions, chat_completions };

// One prompt of the request: text, token ids, or (chat) messages.
struct openai_prompt {
  prompt_kind kind = prompt_kind::text;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<chat_message> messages;
};

struct openai_request {
  openai_endpoint endpoint = openai_endpoint::completions;
  std::string model;
  // Completions may batch several prompts; a chat has exactly one. Choice i*n + j is the j-th
  // sample of prompt i, as OpenAI numbers them.
  std::vector<openai_prompt> prompts;
  int n = 1;
  sampling_params sampling;  // per choice j the seed is seed + j when a seed is given
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // -1: none. Completions: `logprobs` = top n (0..). Chat: `logprobs` true gives 0, and
  // `top_logprobs` the top n.
  int logprobs = -1;

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  const char* prompt_param() const { return endpoint == openai_endpoint::completions ? "prompt" : "messages"; }
};

// The ZeroMQ door's bounds (strings, ids, messages, the context, stop strings, logprobs: the
// same verdicts on both doors) and the HTTP API's own.
struct openai_limits : protocol_limits {
  int max_prompts = 64;
  int max_n = 16;
  int max_choices = 64;         // prompts x n
  int max_json_depth = 32;
};

std::variant<openai_request, api_error> parse_openai_request(openai_endpoint endpoint, std::string_view body,
                                                             const openai_limits& limits);

}  // namespace troupe
