#pragma once
// One HTTP generation request from the engine's side: its choices (prompts x n engine requests,
// with consecutive request ids), the engine events they receive, and OpenAI's response made of
// them — the whole body, or the stream's SSE text piece by piece. Plain class, used by one
// connection thread at a time.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "doors/http/api_error.hpp"
#include "doors/http/openai_request.hpp"
#include "doors/http/openai_response.hpp"
#include "stages/messages.hpp"
#include "text/chat_output_parser.hpp"

namespace troupe {

struct engine_event {
  int choice = 0;
  std::variant<text_delta, request_failed> what;
};

class generation_session {
 public:
  // parsing: how a chat's output is read back into reasoning, content and tool calls (see
  // doors/http/chat_plan.hpp); none: the text is the content as it is.
  generation_session(openai_request request, int64_t first_request_id, int64_t created, token_text_fn token_text,
                     std::optional<output_parsing> parsing = std::nullopt, token_special_fn is_special = nullptr);
  // The same, the response worded by `writer` (another API's: anthropic_response.hpp).
  generation_session(openai_request request, int64_t first_request_id, std::unique_ptr<response_writer> writer,
                     std::optional<output_parsing> parsing);

  // The engine requests to submit, one per choice (seed + j for the j-th sample of a prompt).
  std::vector<tokenize_request> engine_requests() const;
  int64_t request_id(int choice) const;
  int num_choices() const { return request_.num_choices(); }
  const openai_request& request() const { return request_; }

  void apply(engine_event event);

  // Every choice has produced something or failed: the status line can be decided.
  bool all_started() const { return num_started_ == num_choices(); }
  bool all_finished() const { return num_finished_ == num_choices(); }
  // The first failure of any choice (then the whole request has failed).
  const std::optional<api_error>& failure() const { return failure_; }
  // Choices the engine still works on (to abort when the client goes or a sibling failed).
  std::vector<int64_t> unfinished_request_ids() const;

  // Streaming: the SSE events for what was applied since the last call; once every choice has
  // finished (or one failed), the usage chunk when asked for and `data: [DONE]`.
  std::string take_stream_text();
  bool stream_ended() const { return stream_ended_; }
  // Not streaming: the whole response, once all_finished().
  std::string full_body();

 private:
  usage_counts usage() const;
  // The choice's text as the API shows it: parsed when the chat is, its finish reason
  // "tool_calls" when it made calls and stopped by itself.
  void read_back(int choice, choice_output& piece, bool finished);

  openai_request request_;
  int64_t first_request_id_;
  std::unique_ptr<response_writer> writer_;
  std::vector<choice_output> outputs_;                  // [choices]: everything so far (not streaming)
  std::vector<engine_event> unsent_;                    // streaming: applied, not yet in take_stream_text
  std::vector<chat_output_parser> parsers_;             // [choices] when the output is parsed, else empty
  std::vector<bool> called_;                            // [choices]: a tool call was made
  std::vector<std::string> echo_;                       // [choices] with echo: the prompt text not yet sent
  std::vector<bool> started_, finished_;                // [choices]
  std::vector<int> prompt_tokens_, completion_tokens_;  // [choices], from the final delta
  speculative_tally speculative_;                       // the finished choices', summed
  int num_started_ = 0;
  int num_finished_ = 0;
  std::optional<api_error> failure_;
  bool stream_ended_ = false;
};

}  // namespace troupe
