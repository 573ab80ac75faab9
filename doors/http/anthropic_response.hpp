#pragma once
// Anthropic's Messages API responses: the message object (content blocks: thinking, text,
// tool_use; stop_reason end_turn / max_tokens / tool_use; usage) and, streaming, its events:
// message_start, then per block content_block_start, content_block_delta (text_delta,
// thinking_delta, input_json_delta) and content_block_stop, then message_delta (stop_reason,
// usage) and message_stop. One choice per request.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "doors/http/response_writer.hpp"
#include "text/chat_format.hpp"

namespace troupe {

class anthropic_response_builder : public response_writer {
 public:
  // id_syntax and id_seed spell the tool_use ids as the model's template accepts them back.
  anthropic_response_builder(std::string model, std::string id, tool_call_syntax id_syntax, uint64_t id_seed);

  std::string body(const std::vector<choice_output>& choices, const usage_counts& usage) override;
  std::string events(int index, const choice_output& piece) override;
  std::string end(const usage_counts& usage) override;
  std::string failure(const api_error& error) override;

 private:
  enum class block { none, thinking, text };

  nlohmann::ordered_json tool_use(const parsed_tool_call& call);
  std::string open(block kind);  // closes the open block first, when it is another kind
  std::string close();
  std::string start_message();

  std::string model_;
  std::string id_;
  tool_call_syntax id_syntax_;
  uint64_t id_seed_;
  int num_calls_ = 0;
  bool started_ = false;
  block open_ = block::none;
  int index_ = -1;  // the open block's index; blocks are numbered from 0 in order
  std::string stop_reason_ = "end_turn";
};

// Anthropic's name for an OpenAI finish_reason.
const char* anthropic_stop_reason(const std::string& finish_reason);
// {"type": "error", "error": {"type", "message"}}, Anthropic's error body.
std::string anthropic_error_json(const api_error& error);

}  // namespace troupe
