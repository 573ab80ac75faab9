#pragma once
// The text a chat becomes before it is encoded: the model's chat template rendered as Hugging
// Face renders it (messages, the generation prompt, BOS/EOS, tools and any variables the caller
// adds, such as chat_template_kwargs), or, for a model without a template (a base model such as
// stories260K), a plain `role: content` transcript that ends where the assistant speaks next.
// Const and thread-safe: the doors and the tokenizer pool share one.

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.hpp"

namespace troupe {

class tokenizer;

class chat_prompt {
 public:
  chat_prompt() = default;  // no template: the transcript
  explicit chat_prompt(const tokenizer& tok);

  // messages: [{role, content, ...}] as templates read them (tool_calls, tool_call_id, name,
  // reasoning_content...). variables: more template variables (tools, enable_thinking,
  // reasoning_effort, ...); a name the renderer sets itself (messages, add_generation_prompt,
  // bos_token, eos_token) is an error. Throws std::runtime_error or std::invalid_argument with
  // the template's own message when rendering fails.
  std::string render(const nlohmann::ordered_json& messages,
                     const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
                     bool add_generation_prompt = true) const;

  bool has_template() const { return template_ != nullptr; }
  // The template's text ("" without one): what chat_format is read from.
  const std::string& template_source() const;

 private:
  std::shared_ptr<const chat_template> template_;  // null: the model has none
  std::string bos_token_;
  std::string eos_token_;
};

// Whether a rendered prompt leaves the model inside an open <think> (DeepSeek-R1's templates, and
// Qwen3's thinking variants, open it for the model): its output then begins as reasoning.
bool prompt_opens_reasoning(const std::string& prompt);

}  // namespace troupe
