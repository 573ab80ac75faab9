#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/template.hpp"

namespace troupe {

// A model's chat template (tokenizer_config.json "chat_template"), rendered the way Hugging Face
// renders it: trim_blocks and lstrip_blocks on, with @huggingface/jinja's semantics.
class chat_template {
 public:
  // Parses; throws std::runtime_error (jinja_syntax_error) naming line:column on syntax errors.
  explicit chat_template(std::string source);

  // messages: JSON array of {role, content, ...}. Returns the rendered prompt. extra_context adds
  // template variables (tools, enable_thinking, date_string, ...); a key that clashes with
  // messages, add_generation_prompt, bos_token or eos_token is an error. Throws std::runtime_error
  // (jinja_runtime_error) when rendering fails, including the template's own raise_exception().
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt, const std::string& bos_token,
                    const std::string& eos_token, const nlohmann::json& extra_context = nlohmann::json::object()) const;

  // The same with insertion-ordered objects: `tojson` then writes keys (of tools, tool-call
  // arguments) in the order the client sent them, as Python and JavaScript do. nlohmann::json
  // sorts keys alphabetically.
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt, const std::string& bos_token,
                    const std::string& eos_token, const nlohmann::ordered_json& extra_context) const;

  const std::string& source() const { return template_.source(); }

 private:
  template <typename Json>
  std::string apply_any(const Json& messages, bool add_generation_prompt, const std::string& bos_token,
                        const std::string& eos_token, const Json& extra_context) const;

  jinja_template template_;
};

}  // namespace troupe
