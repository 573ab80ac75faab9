#pragma once
// The host's side of a troupe_reply (include/troupe/plugin.h): what a hook hands back, copied
// out of the plugin's buffers during the call.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "include/troupe/plugin.h"

namespace troupe {

struct plugin_reply {
  plugin_reply();
  plugin_reply(const plugin_reply&) = delete;
  plugin_reply& operator=(const plugin_reply&) = delete;

  troupe_reply c;  // what the plugin gets; c.host points back here
  std::string message;
  std::optional<std::vector<int32_t>> prompt_ids;
  std::optional<std::string> text;
  // Replies beyond these bounds are garbage: the call fails its request instead of copying them.
  size_t max_ids = 0;
  size_t max_text = 0;
  std::string overflow;  // what was too large, when something was
};

}  // namespace troupe
