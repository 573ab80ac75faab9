// Token quota: a request-hook plugin, in C++ over the header-only wrapper (troupe/plugin.hpp),
// that gives each API key (the request's tenant) a budget of tokens and refuses requests past it.
//
// A template to copy. What it shows:
//  - state across requests (tokens spent per key), guarded by a mutex: the tokenizer pool calls
//    one plugin instance from several threads;
//  - rejecting with a message the client reads ("plugin 'token-quota' rejected the request: ...");
//  - rewriting the sampling parameters: max_tokens is cut to what is left of the key's budget;
//  - configuration from JSON, refused at start when wrong (the server names the library).
//
// A request is charged its prompt tokens plus its max_tokens (what it may spend), when it is
// admitted. Configuration: {"tokens_per_key": 1000, "anonymous": true}; anonymous: whether
// requests without an API key are served (charged to one shared budget).
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <troupe/plugin.hpp>

namespace {

class token_quota {
 public:
  explicit token_quota(std::string_view config_json) {
    const auto config = nlohmann::json::parse(config_json);
    tokens_per_key_ = config.value("tokens_per_key", int64_t{1000});
    anonymous_ = config.value("anonymous", true);
    if (tokens_per_key_ <= 0) throw std::runtime_error("tokens_per_key must be positive");
  }

  troupe_plugin_status on_request(const troupe_request& request, troupe_sampling& sampling,
                                  troupe::plugin_reply_ref reply) {
    const std::string key(request.tenant, request.tenant_len);
    if (key.empty() && !anonymous_) {
      reply.message("requests need an API key");
      return TROUPE_PLUGIN_REJECT;
    }
    std::lock_guard lock(mutex_);
    int64_t& spent = spent_[key];
    const int64_t left = tokens_per_key_ - spent - static_cast<int64_t>(request.num_prompt_ids);
    if (left < 1) {
      reply.message("the key '" + key + "' has used its quota of " + std::to_string(tokens_per_key_) + " tokens (" +
                    std::to_string(spent) + " spent, this prompt has " + std::to_string(request.num_prompt_ids) + ")");
      return TROUPE_PLUGIN_REJECT;
    }
    if (sampling.max_tokens > left) sampling.max_tokens = static_cast<int32_t>(left);
    spent += static_cast<int64_t>(request.num_prompt_ids) + sampling.max_tokens;
    return TROUPE_PLUGIN_OK;
  }

 private:
  int64_t tokens_per_key_ = 0;
  bool anonymous_ = true;
  std::mutex mutex_;
  std::unordered_map<std::string, int64_t> spent_;  // by key
};

}  // namespace

TROUPE_PLUGIN_CLASS(token_quota, "token-quota")
