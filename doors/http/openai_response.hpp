#pragma once
// OpenAI's response bodies for completions and chat completions: the whole response
// (non-streaming) and the chunks of a stream, with usage and logprobs. One builder per HTTP
// request; it remembers what each choice has already been sent (the chat role goes in a choice's
// first chunk, completions' text_offset runs on across chunks).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "doors/http/openai_request.hpp"
#include "doors/speculative_usage.hpp"
#include "engine/token_delta.hpp"

namespace troupe {

// What one choice produced: a stream chunk's worth, or all of it.
struct choice_output {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<token_logprobs> logprobs;  // [token_ids.size()] when logprobs were asked for
  std::optional<std::string> finish_reason;
};

struct usage_counts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  speculative_tally speculative;  // every choice's; shown as usage.speculative when it has drafts
};

// A token's text as logprobs show it.
using token_text_fn = std::function<std::string(int32_t token_id)>;

class openai_response_builder {
 public:
  openai_response_builder(const openai_request& request, std::string id, int64_t created, token_text_fn token_text);

  nlohmann::json full_response(const std::vector<choice_output>& choices, const usage_counts& usage);
  nlohmann::json chunk(int index, const choice_output& piece);
  // The last chunk of a stream that asked for stream_options.include_usage: no choices.
  nlohmann::json usage_chunk(const usage_counts& usage) const;

  const std::string& id() const { return id_; }

 private:
  nlohmann::json choice_logprobs(int index, const choice_output& piece);
  nlohmann::json envelope(const char* object) const;

  openai_endpoint endpoint_;
  std::string model_;
  std::string id_;
  int64_t created_;
  int logprobs_;
  bool include_usage_;
  token_text_fn token_text_;
  std::vector<bool> role_sent_;           // [choices]: chat streams name the role once
  std::vector<size_t> num_text_bytes_;    // [choices]: completions' text_offset so far
};

nlohmann::json usage_json(const usage_counts& usage);
// Serializes with invalid UTF-8 (a lone byte token's text) replaced, never throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace troupe
