#include "text/chat_template.hpp"

#include <stdexcept>

namespace troupe {

chat_template::chat_template(std::string source) : template_(std::move(source)) {}

template <typename Json>
std::string chat_template::apply_any(const Json& messages, bool add_generation_prompt, const std::string& bos_token,
                                     const std::string& eos_token, const Json& extra_context) const {
  if (!messages.is_array()) throw std::invalid_argument("chat_template::apply: messages must be a JSON array");
  if (!extra_context.is_null() && !extra_context.is_object()) {
    throw std::invalid_argument("chat_template::apply: extra_context must be a JSON object");
  }
  std::vector<std::pair<std::string, jinja_value>> variables;
  variables.emplace_back("messages", jinja_value::from_json(messages));
  variables.emplace_back("add_generation_prompt", jinja_value::boolean(add_generation_prompt));
  variables.emplace_back("bos_token", jinja_value::string(bos_token));
  variables.emplace_back("eos_token", jinja_value::string(eos_token));
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      for (const auto& [name, value] : variables) {
        if (name == it.key()) {
          throw std::invalid_argument("chat_template::apply: extra_context key '" + it.key() +
                                      "' clashes with a variable apply() sets itself");
        }
      }
      variables.emplace_back(it.key(), jinja_value::from_json(it.value()));
    }
  }
  return template_.render(variables);
}

std::string chat_template::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::json& extra_context) const {
  return apply_any(messages, add_generation_prompt, bos_token, eos_token, extra_context);
}

std::string chat_template::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::ordered_json& extra_context) const {
  return apply_any(messages, add_generation_prompt, bos_token, eos_token, extra_context);
}

}  // namespace troupe
