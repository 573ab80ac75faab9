#include "plugins/plugin_reply.hpp"

namespace troupe {
namespace {

plugin_reply& host_of(troupe_reply* reply) { return *static_cast<plugin_reply*>(reply->host); }

constexpr size_t max_message_bytes = 4096;  // longer messages are cut, not refused

void set_message(troupe_reply* reply, const char* text, size_t len) {
  if (!reply || (!text && len)) return;
  host_of(reply).message.assign(text, std::min(len, max_message_bytes));
}

void set_prompt_ids(troupe_reply* reply, const int32_t* ids, size_t num_ids) {
  if (!reply) return;
  plugin_reply& host = host_of(reply);
  if (num_ids > host.max_ids || (!ids && num_ids)) {
    host.overflow =
        "set_prompt_ids with " + std::to_string(num_ids) + " ids (at most " + std::to_string(host.max_ids) + ")";
    return;
  }
  host.prompt_ids.emplace(ids, ids + num_ids);
}

void set_text(troupe_reply* reply, const char* text, size_t len) {
  if (!reply) return;
  plugin_reply& host = host_of(reply);
  if (len > host.max_text || (!text && len)) {
    host.overflow = "set_text with " + std::to_string(len) + " bytes (at most " + std::to_string(host.max_text) + ")";
    return;
  }
  host.text.emplace(text, len);
}

}  // namespace

plugin_reply::plugin_reply() {
  c.host = this;
  c.set_message = &set_message;
  c.set_prompt_ids = &set_prompt_ids;
  c.set_text = &set_text;
}

}  // namespace troupe
