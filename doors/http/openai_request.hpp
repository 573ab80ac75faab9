#pragma once
// The body of POST /v1/completions and POST /v1/chat/completions, parsed and checked. Every
// problem becomes a 400 api_error whose `param` names the field (OpenAI's shape). Fields this
// server does not know are ignored, as vLLM and llama.cpp ignore them (agent frameworks send
// fields of newer API versions): their names are kept, for the log and a response header.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "doors/http/api_error.hpp"
#include "doors/http/chat_request.hpp"
#include "protocol/protocol_limits.hpp"
#include "protocol/sampling_params.hpp"
#include "protocol/service_targets.hpp"
#include "stages/messages.hpp"

namespace troupe {

// anthropic_messages: Anthropic's POST /v1/messages (anthropic_request.hpp), read into the same
// request: a chat of one choice. embeddings: POST /v1/embeddings, one engine request per input.
enum class openai_endpoint { completions, chat_completions, anthropic_messages, embeddings };

// One prompt of the request: text or token ids; a chat's, once the door has rendered it
// (prompt_kind::rendered_chat, text).
struct openai_prompt {
  prompt_kind kind = prompt_kind::text;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct openai_request {
  openai_endpoint endpoint = openai_endpoint::completions;
  std::string model;
  // Completions may batch several prompts; a chat has exactly one. Choice i*n + j is the j-th
  // sample of prompt i, as OpenAI numbers them.
  std::vector<openai_prompt> prompts;
  int n = 1;
  sampling_params sampling;  // per choice j the seed is seed + j when a seed is given
  int priority = 0;          // lower runs first (the priority policy)
  service_targets targets;   // `slo` and `tenant` (or OpenAI's `user`)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // -1: none. Completions: `logprobs` = top n (0..). Chat: `logprobs` true gives 0, and
  // `top_logprobs` the top n.
  int logprobs = -1;
  bool echo = false;              // completions: the prompt's text comes first in each choice
  std::string guided_param;       // the field that asked for structured output (response_format, guided_json...)
  chat_request chat;              // chat completions: the conversation, its tools, the template's variables
  bool embedding_base64 = false;  // embeddings: encoding_format "base64" (little-endian float32)
  int embedding_dimensions = 0;   // embeddings: `dimensions` (0: not given; must be the model's)
  // Fields the server does not know, ignored ("bogus", "messages[1].extra").
  std::vector<std::string> ignored_fields;

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  bool is_chat() const {
    return endpoint == openai_endpoint::chat_completions || endpoint == openai_endpoint::anthropic_messages;
  }
  const char* prompt_param() const {
    return endpoint == openai_endpoint::completions  ? "prompt"
           : endpoint == openai_endpoint::embeddings ? "input"
                                                     : "messages";
  }
};

// The ZeroMQ door's bounds (strings, ids, messages, the context, stop strings, logprobs: the
// same verdicts on both doors) and the HTTP API's own.
struct openai_limits : protocol_limits {
  int max_prompts = 64;
  int max_n = 16;
  int max_choices = 64;  // prompts x n
  int max_json_depth = 32;
  int max_embedding_inputs = 2048;  // inputs of one /v1/embeddings request
};

std::variant<openai_request, api_error> parse_openai_request(openai_endpoint endpoint, std::string_view body,
                                                             const openai_limits& limits);

}  // namespace troupe
