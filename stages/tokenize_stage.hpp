#pragma once
// The tokenizer stage's work, without the actor: text, token ids or chat messages in, checked
// prompt ids out (or the error the client gets). Thread-safe (const), so a pool shares one.

#include <memory>
#include <variant>

#include "plugins/plugin_chain.hpp"
#include "stages/messages.hpp"
#include "text/chat_prompt.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

class tokenize_stage {
 public:
  // vocab_size: the model's; max_model_len: prompt + output tokens of one sequence; plugins:
  // the request hooks each checked prompt goes through last (null: none); the logits plugins
  // among them are the only names a request's `plugins` may give.
  tokenize_stage(tokenizer tok, int vocab_size, int max_model_len, std::shared_ptr<plugin_chain> plugins = nullptr);

  std::variant<schedule_request, request_failed> run(tokenize_request request) const;

  // The text a chat is turned into before encoding: the model's chat template (with the
  // generation prompt) when it has one, else a plain `role: content` transcript.
  std::string render_chat(const std::vector<chat_message>& messages) const;
  bool has_chat_template() const { return chat_prompt_.has_template(); }

 private:
  tokenizer tokenizer_;
  chat_prompt chat_prompt_;
  int vocab_size_;
  int max_model_len_;
  std::shared_ptr<plugin_chain> plugins_;    // thread-safe: the pool's actors share it
  std::vector<std::string> logits_plugins_;  // the server's plugins that run the logits hook
};

}  // namespace troupe
