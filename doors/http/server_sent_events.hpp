#pragma once
// Server-Sent Events framing: one `data:` line per event (after an `event:` line naming it, as
// Anthropic's streams do), a blank line after it; OpenAI's streams end with `data: [DONE]`. A
// JSON payload has no raw newlines, so one line always suffices.

#include <string>
#include <string_view>

namespace troupe::sse {

inline std::string event(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  out += "data: ";
  out += data;
  out += "\n\n";
  return out;
}

// An event with a name: `event: NAME` then its data.
inline std::string named_event(std::string_view name, std::string_view data) {
  std::string out;
  out.reserve(name.size() + data.size() + 16);
  out += "event: ";
  out += name;
  out += "\n";
  out += event(data);
  return out;
}

inline constexpr std::string_view done = "data: [DONE]\n\n";

// A comment line: clients ignore it; writing it tells a stream whose client has gone.
inline constexpr std::string_view keep_alive = ": keep-alive\n\n";

}  // namespace troupe::sse
