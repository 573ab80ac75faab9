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
#include "doors/http/response_writer.hpp"

namespace troupe {

// The bytes a token adds to the text (tokenizer::token_bytes): what logprobs show.
using token_text_fn = std::function<std::string(int32_t token_id)>;
// Whether a token is special (tokenizer::is_special): a text that skips special tokens has none
// of its bytes, and neither do its logprobs.
using token_special_fn = std::function<bool(int32_t token_id)>;

class openai_response_builder : public response_writer {
 public:
  // parsing: how a chat's output is read back (null: its text is the content, as it is); it says
  // whether messages carry reasoning_content, and how tool call ids are spelled.
  openai_response_builder(const openai_request& request, std::string id, int64_t created, token_text_fn token_text,
                          const output_parsing* parsing = nullptr, uint64_t id_seed = 0,
                          token_special_fn is_special = nullptr);

  nlohmann::json full_response(const std::vector<choice_output>& choices, const usage_counts& usage);
  // One piece of a stream as chunks: a chat's reasoning, content and tool calls each in a chunk
  // of its own (the first carries the logprobs, the last the finish_reason).
  std::vector<nlohmann::json> chunks(int index, const choice_output& piece);
  // The last chunk of a stream that asked for stream_options.include_usage: no choices.
  nlohmann::json usage_chunk(const usage_counts& usage) const;

  const std::string& id() const { return id_; }

  // response_writer: the JSON above as bodies and `data:` events, `data: [DONE]` at the end.
  std::string body(const std::vector<choice_output>& choices, const usage_counts& usage) override;
  std::string events(int index, const choice_output& piece) override;
  std::string end(const usage_counts& usage) override;
  std::string failure(const api_error& error) override;
  void text_before(int index, const std::string& text) override;

 private:
  nlohmann::json choice_logprobs(int index, const choice_output& piece);
  // The bytes an output token adds to the text: none for a special token the text skips
  // (skip_special_tokens, vLLM's default), so that logprobs' bytes and offsets agree with it.
  std::string output_bytes(int32_t token_id) const;
  // vLLM's prompt_logprobs: null for the first prompt token, then {"token id": {logprob, rank,
  // decoded_token}} with the prompt's token and the top n. Null when the piece has none.
  nlohmann::json prompt_logprobs_json(const choice_output& piece) const;
  nlohmann::json envelope(const char* object) const;
  nlohmann::json tool_calls_json(int index, const std::vector<parsed_tool_call>& calls, bool streamed);

  openai_endpoint endpoint_;
  std::string model_;
  std::string id_;
  int64_t created_;
  int logprobs_;
  int prompt_logprobs_;
  std::vector<bool> prompt_logprobs_sent_;  // [choices]: a stream sends them once, with the first token
  bool include_usage_;
  bool chat_;
  token_text_fn token_text_;
  token_special_fn is_special_;
  bool skip_special_tokens_;
  std::vector<bool> role_sent_;         // [choices]: chat streams name the role once
  std::vector<size_t> num_text_chars_;  // [choices]: completions' text_offset so far (code points)
  std::vector<int> num_tool_calls_;     // [choices]: calls sent so far (their stream index)
  bool reasoning_field_ = false;
  tool_call_syntax id_syntax_ = tool_call_syntax::none;
  uint64_t id_seed_ = 0;
};

// A token's bytes as logprobs show them: `token` is the text when the bytes are whole UTF-8,
// else "bytes:\xe2\x80" (vLLM's spelling of a piece of a character).
std::string logprob_token_text(const std::string& bytes);

nlohmann::json usage_json(const usage_counts& usage);
// Serializes with invalid UTF-8 (a lone byte token's text) replaced, never throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace troupe
