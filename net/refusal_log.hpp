#pragma once
// Refused connections (or requests), logged at a bounded rate. A flood of strangers (thousands of
// connections a second), or of requests past capacity, must not become a flood of log lines: the
// first refusal of a window is logged at once, in full, and the rest are counted by reason and
// logged as one summary line when the window has passed (at the next refusal or the owner's next
// `flush`). Thread-safe.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace troupe {

class refusal_log {
 public:
  // `where` names the listener in every line, e.g. "cluster port 127.0.0.1:4500"; `what` is
  // what it refuses ("connection", "request").
  explicit refusal_log(std::string where, std::chrono::milliseconds window = std::chrono::seconds(10),
                       std::string what = "connection");

  // One refusal. `reason` is counted under `kind` (a short fixed phrase, e.g. "no TLS
  // handshake within 5000 ms") and logged in full when it is the window's first.
  void refuse(std::string_view kind, std::string_view reason);
  void refuse(std::string_view kind) { refuse(kind, kind); }
  // Logs the window's summary once the window has passed.
  void flush();

  uint64_t num_refused() const;
  uint64_t num_lines() const;  // warnings written: the rate test's measure

 private:
  void summarize_locked(std::chrono::steady_clock::time_point now);

  const std::string where_;
  const std::chrono::milliseconds window_;
  const std::string what_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point window_start_{};
  bool logged_in_window_ = false;
  std::map<std::string, uint64_t, std::less<>> held_;  // refusals counted, not yet logged, by kind
  uint64_t num_refused_ = 0;
  uint64_t num_lines_ = 0;
};

}  // namespace troupe
