#include "text/chat_prompt.hpp"

#include "text/tokenizer.hpp"

namespace troupe {

chat_prompt::chat_prompt(const tokenizer& tok) : bos_token_(tok.bos_token()), eos_token_(tok.eos_token()) {
  if (!tok.chat_template_source().empty())
    template_ = std::make_shared<const chat_template>(tok.chat_template_source());
}

const std::string& chat_prompt::template_source() const {
  static const std::string none;
  return template_ ? template_->source() : none;
}

std::string chat_prompt::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& variables,
                                bool add_generation_prompt) const {
  if (template_) return template_->apply(messages, add_generation_prompt, bos_token_, eos_token_, variables);
  std::string text;
  for (const auto& m : messages) {
    const auto content = m.find("content");
    text += m.value("role", std::string("user")) + ": ";
    if (content != m.end() && content->is_string()) text += content->get<std::string>();
    text += "\n";
  }
  if (add_generation_prompt) text += "assistant:";
  return text;
}

bool prompt_opens_reasoning(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  const size_t close = prompt.rfind("</think>");
  return close == std::string::npos || close < open;
}

}  // namespace troupe
