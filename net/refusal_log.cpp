#include "net/refusal_log.hpp"

#include <spdlog/spdlog.h>

namespace troupe {

refusal_log::refusal_log(std::string where, std::chrono::milliseconds window, std::string what)
    : where_(std::move(where)), window_(window), what_(std::move(what)) {}

void refusal_log::refuse(std::string_view kind, std::string_view reason) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  ++num_refused_;
  summarize_locked(now);
  if (!logged_in_window_) {
    logged_in_window_ = true;
    window_start_ = now;
    ++num_lines_;
    spdlog::warn("{}: refused a {}: {} (more refusals are summed every {} s)", where_, what_, reason,
                 window_.count() / 1000.0);
    return;
  }
  auto it = held_.find(kind);
  if (it == held_.end()) it = held_.emplace(std::string(kind), 0).first;
  ++it->second;
}

void refusal_log::flush() {
  std::lock_guard lock(mutex_);
  summarize_locked(std::chrono::steady_clock::now());
}

void refusal_log::summarize_locked(std::chrono::steady_clock::time_point now) {
  if (!logged_in_window_ || now - window_start_ < window_) return;
  logged_in_window_ = false;
  if (held_.empty()) return;
  uint64_t total = 0;
  std::string kinds;
  for (const auto& [kind, count] : held_) {
    total += count;
    kinds += (kinds.empty() ? "" : "; ") + kind + " x" + std::to_string(count);
  }
  held_.clear();
  // The summary opens the next window: a steady flood logs one line per window.
  logged_in_window_ = true;
  window_start_ = now;
  ++num_lines_;
  spdlog::warn("{}: refused {} more {}{} in the last {} s: {}", where_, total, what_, total == 1 ? "" : "s",
               window_.count() / 1000.0, kinds);
}

uint64_t refusal_log::num_refused() const {
  std::lock_guard lock(mutex_);
  return num_refused_;
}

uint64_t refusal_log::num_lines() const {
  std::lock_guard lock(mutex_);
  return num_lines_;
}

}  // namespace troupe
