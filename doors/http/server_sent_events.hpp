#pragma once
// Server-Sent Events framing for OpenAI streams: one `data:` line per event, a blank line after
// it, `data: [DONE]` at the end. A JSON payload has no raw newlines, so one line always suffices.

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

inline constexpr std::string_view done = "data: [DONE]\n\n";

// A comment line: clients ignore it; writing it tells a stream whose client has gone.
inline constexpr std::string_view keep_alive = ": keep-alive\n\n";

}  // namespace troupe::sse
