#pragma once
// When `troupe launch` starts a node again that died (issue 26): a plain decision from the way
// the node ended and its history, so the supervising loop stays a loop. Back-off doubles from
// `first_delay` up to `max_delay` between restarts that follow one another, and starts over once
// a node has run `stable_after`; more than `max_restarts` within `window` and launch gives up on
// the node (a node that cannot start — a port taken, a broken model — would otherwise cycle
// forever, each start failing the same way).

#include <chrono>
#include <deque>
#include <string>
#include <string_view>

namespace troupe {

// [[nodes]] restart: which ends of a node launch answers with a new start.
enum class restart_mode {
  always,      // any end, a clean exit too
  on_failure,  // a non-zero exit code or a signal (the default)
  never,       // launch only logs the end
};

// "always" | "on-failure" | "never"; throws std::runtime_error quoting `text` otherwise.
restart_mode parse_restart_mode(std::string_view text);
std::string_view restart_mode_name(restart_mode mode);

struct restart_limits {
  std::chrono::milliseconds first_delay{500};
  std::chrono::milliseconds max_delay{30000};
  std::chrono::milliseconds stable_after{60000};  // a run this long resets the back-off
  int max_restarts = 5;                           // within `window`; one more and launch gives up
  std::chrono::milliseconds window{300000};
};

struct restart_decision {
  enum class action {
    restart,    // start it again after `delay`
    stay_down,  // its end is one the mode leaves alone (a clean exit under on-failure, never)
    give_up,    // it ended too often: leave it down, and say so
  };
  action what = action::stay_down;
  std::chrono::milliseconds delay{0};
  std::string why;  // for the log: "restart = never", "5 restarts within 300 s"
};

class restart_policy {
 public:
  using clock = std::chrono::steady_clock;

  explicit restart_policy(restart_mode mode, restart_limits limits = {});

  // The node ended at `now` after running `ran_for`; `failed` when by a non-zero exit code or a
  // signal. Restarts it decides on are counted from `now`.
  restart_decision after_exit(bool failed, clock::duration ran_for, clock::time_point now);

  // The delay the next restart would wait (for tests and logs).
  std::chrono::milliseconds next_delay() const { return next_delay_; }

 private:
  restart_mode mode_;
  restart_limits limits_;
  std::chrono::milliseconds next_delay_;
  std::deque<clock::time_point> restarts_;  // within the window, oldest first
};

}  // namespace troupe
