#pragma once
// How one API spells a generation's response on the wire: OpenAI's chat completion and text
// completion objects and chunks (openai_response.hpp), Anthropic's message and its stream events
// (anthropic_response.hpp). The session (generation_session.hpp) decides what each choice
// produced; a writer only words it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "doors/http/api_error.hpp"
#include "doors/speculative_usage.hpp"
#include "engine/token_delta.hpp"
#include "text/chat_output_parser.hpp"

namespace troupe {

// What one choice produced: a stream chunk's worth, or all of it. A chat whose output is parsed
// (reasoning, tool calls) has `text` as the answer's content only.
struct choice_output {
  std::string text;
  std::string reasoning;
  std::vector<parsed_tool_call> tool_calls;
  std::vector<int32_t> token_ids;
  std::vector<token_logprobs> logprobs;  // [token_ids.size()] when logprobs were asked for
  std::vector<float> embedding;          // an embedding request's vector
  // The prompt's logprobs (prompt_logprobs), on the piece with the first token: one per prompt
  // token after the first. `has_prompt_logprobs` tells an empty list (a one-token prompt) from none.
  std::vector<prompt_token_logprob> prompt_logprobs;
  bool has_prompt_logprobs = false;
  // OpenAI's words: "stop", "length", "tool_calls" (a chat that called tools and stopped).
  std::optional<std::string> finish_reason;
};

struct usage_counts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  speculative_tally speculative;  // every choice's; shown as usage.speculative when it has drafts
};

class response_writer {
 public:
  virtual ~response_writer() = default;
  // The whole response, once every choice has finished (a request that did not stream).
  virtual std::string body(const std::vector<choice_output>& choices, const usage_counts& usage) = 0;
  // Server-sent events for one piece of a choice's output.
  virtual std::string events(int index, const choice_output& piece) = 0;
  // The events that end a stream once every choice has finished.
  virtual std::string end(const usage_counts& usage) = 0;
  // The events that end a stream that failed after it began.
  virtual std::string failure(const api_error& error) = 0;
  // Text a choice shows before its tokens (echo): logprob offsets count past it.
  virtual void text_before(int index, const std::string& text) {
    (void)index;
    (void)text;
  }
};

}  // namespace troupe
