#include "stages/tokenize_stage.hpp"

#include <algorithm>

#include "stages/stage_clock.hpp"

namespace troupe {

tokenize_stage::tokenize_stage(tokenizer tok, int vocab_size, int max_model_len, std::shared_ptr<plugin_chain> plugins)
    : tokenizer_(std::move(tok)),
      chat_prompt_(tokenizer_),
      vocab_size_(vocab_size),
      max_model_len_(max_model_len),
      plugins_(std::move(plugins)) {
  if (plugins_) logits_plugins_ = plugins_->names_running("logits");
  if (plugins_ && plugins_->empty()) plugins_.reset();
}

std::string tokenize_stage::render_chat(const std::vector<chat_message>& messages) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return chat_prompt_.render(list);
}

std::variant<schedule_request, request_failed> tokenize_stage::run(tokenize_request request) const {
  auto fail = [&](error_code code, std::string message) {
    return request_failed{request.request_id, code, std::move(message)};
  };
  const timestamp_ns received = steady_now_ns();
  schedule_request out;
  out.request_id = request.request_id;
  out.priority = request.priority;
  out.targets = request.targets;
  const char* field = "prompt";
  std::string prompt_text;  // what the request hooks see as the prompt's text
  try {
    switch (request.kind) {
      case prompt_kind::text:
        out.prompt_ids = tokenizer_.encode(request.prompt);
        if (plugins_) prompt_text = request.prompt;
        break;
      case prompt_kind::token_ids:
        field = "prompt_token_ids";
        for (size_t i = 0; i < request.prompt_token_ids.size(); ++i) {
          if (request.prompt_token_ids[i] >= vocab_size_) {
            return fail(error_code::bad_request, "field 'prompt_token_ids[" + std::to_string(i) +
                                                     "]': " + std::to_string(request.prompt_token_ids[i]) +
                                                     " is outside the vocabulary of " + std::to_string(vocab_size_));
          }
        }
        out.prompt_ids = std::move(request.prompt_token_ids);
        break;
      case prompt_kind::messages:
        field = "messages";
        // A template writes BOS and the like itself (as Hugging Face's apply_chat_template).
        prompt_text = render_chat(request.messages);
        out.prompt_ids = tokenizer_.encode(prompt_text, /*add_special_tokens=*/!has_chat_template());
        break;
      case prompt_kind::rendered_chat:
        field = "messages";
        out.prompt_ids = tokenizer_.encode(request.prompt, /*add_special_tokens=*/!has_chat_template());
        if (plugins_) prompt_text = request.prompt;
        break;
    }
  } catch (const std::exception& e) {
    return fail(error_code::bad_request, std::string("field '") + field + "': cannot tokenize: " + e.what());
  }
  if (out.prompt_ids.empty()) {
    return fail(error_code::bad_request, std::string("field '") + field + "': encodes to no tokens");
  }
  if (static_cast<int64_t>(out.prompt_ids.size()) >= max_model_len_) {
    return fail(error_code::prompt_too_long, std::string("field '") + field + "': the prompt has " +
                                                 std::to_string(out.prompt_ids.size()) +
                                                 " tokens, leaving no room to generate within the context of " +
                                                 std::to_string(max_model_len_) + " tokens");
  }
  for (const token_bias& b : request.sampling.logit_bias) {
    if (b.token_id >= vocab_size_) {
      return fail(error_code::bad_request, "field 'logit_bias': token id " + std::to_string(b.token_id) +
                                               " is outside the vocabulary of " + std::to_string(vocab_size_));
    }
  }
  for (size_t i = 0; i < request.sampling.logits_plugins.size(); ++i) {
    const std::string& name = request.sampling.logits_plugins[i];
    if (std::find(logits_plugins_.begin(), logits_plugins_.end(), name) == logits_plugins_.end()) {
      std::string loaded;
      for (const std::string& known : logits_plugins_) loaded += (loaded.empty() ? "'" : ", '") + known + "'";
      return fail(error_code::bad_request, "field 'plugins[" + std::to_string(i) + "]': no logits plugin named '" +
                                               name + "' is loaded (" + (loaded.empty() ? "none is" : loaded + " are") +
                                               ")");
    }
  }
  out.sampling = std::move(request.sampling);
  if (plugins_) {
    // Last, so the hooks see a prompt the server would run; what they rewrite is checked again.
    auto verdict = plugins_->on_request(request.request_id, out.prompt_ids, prompt_text, request.targets.tenant,
                                        out.sampling, vocab_size_, max_model_len_);
    if (verdict) {
      return fail(verdict->what == plugin_verdict::kind::rejected ? error_code::bad_request : error_code::internal,
                  std::move(verdict->message));
    }
  }
  out.tokenize_ns = steady_now_ns() - received;
  return out;
}

}  // namespace troupe
