#pragma once
// The worker's logits hook (engine/logits_hook.hpp) over the plugins that run on_logits
// (plugins/plugin_chain): the runner's rows go to the plugins a request named, each call timed
// and checked there, its failure the request's message.

#include <memory>

#include "engine/logits_hook.hpp"
#include "plugins/plugin_chain.hpp"

namespace troupe {

class plugin_logits_hook final : public logits_hook {
 public:
  explicit plugin_logits_hook(std::shared_ptr<plugin_chain> plugins) : plugins_(std::move(plugins)) {}

  std::string process(const std::vector<std::string>& names, int64_t request_id, std::span<const int32_t> token_ids,
                      int32_t num_prompt_tokens, std::span<float> logits) override {
    auto verdict = plugins_->on_logits(names, request_id, token_ids, static_cast<size_t>(num_prompt_tokens), logits);
    return verdict ? verdict->message : std::string();
  }
  void end(int64_t request_id, const std::vector<std::string>& names) override {
    plugins_->end_request(request_id, names);
  }

 private:
  std::shared_ptr<plugin_chain> plugins_;
};

}  // namespace troupe
