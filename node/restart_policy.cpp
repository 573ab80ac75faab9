#include "node/restart_policy.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe {

restart_mode parse_restart_mode(std::string_view text) {
  if (text == "always") return restart_mode::always;
  if (text == "on-failure") return restart_mode::on_failure;
  if (text == "never") return restart_mode::never;
  throw std::runtime_error("restart must be \"always\", \"on-failure\" or \"never\", got \"" + std::string(text) +
                           "\"");
}

std::string_view restart_mode_name(restart_mode mode) {
  switch (mode) {
    case restart_mode::always: return "always";
    case restart_mode::on_failure: return "on-failure";
    case restart_mode::never: return "never";
  }
  return "?";
}

restart_policy::restart_policy(restart_mode mode, restart_limits limits)
    : mode_(mode), limits_(limits), next_delay_(limits.first_delay) {
  if (limits_.first_delay.count() < 0 || limits_.max_delay < limits_.first_delay || limits_.max_restarts < 0 ||
      limits_.window.count() <= 0) {
    throw std::invalid_argument("restart_policy: limits out of range");
  }
}

restart_decision restart_policy::after_exit(bool failed, clock::duration ran_for, clock::time_point now) {
  if (mode_ == restart_mode::never) return {restart_decision::action::stay_down, {}, "restart = \"never\""};
  if (mode_ == restart_mode::on_failure && !failed) {
    return {restart_decision::action::stay_down, {}, "it exited cleanly and restart = \"on-failure\""};
  }
  // A node that ran a while before this end is not crash-looping: its back-off starts over.
  if (ran_for >= limits_.stable_after) next_delay_ = limits_.first_delay;
  while (!restarts_.empty() && now - restarts_.front() >= limits_.window) restarts_.pop_front();
  if (static_cast<int>(restarts_.size()) >= limits_.max_restarts) {
    const auto window_s = std::chrono::duration_cast<std::chrono::seconds>(limits_.window).count();
    return {restart_decision::action::give_up,
            {},
            std::to_string(restarts_.size()) + " restarts within " + std::to_string(window_s) + " s"};
  }
  restarts_.push_back(now);
  const std::chrono::milliseconds delay = next_delay_;
  next_delay_ = std::min(limits_.max_delay, next_delay_ * 2);
  return {restart_decision::action::restart, delay, "back-off " + std::to_string(delay.count()) + " ms"};
}

}  // namespace troupe
