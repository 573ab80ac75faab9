#include "node/node_supervisor.hpp"

#include <optional>

#include <spdlog/spdlog.h>

namespace troupe {

namespace {
constexpr auto watch_interval = std::chrono::milliseconds(100);
}  // namespace

struct node_supervisor::watched {
  supervised_child child;
  restart_policy policy;
  std::chrono::steady_clock::time_point started;
  std::optional<std::chrono::steady_clock::time_point> restart_at;  // a restart waiting its back-off
  bool down = false;  // left down for good (its mode, or launch gave up on it)
};

node_supervisor::node_supervisor(node_launcher& launcher, std::vector<supervised_child> children, restart_limits limits)
    : launcher_(launcher) {
  const auto now = std::chrono::steady_clock::now();
  for (supervised_child& c : children) {
    const restart_mode mode = c.mode;
    children_.push_back({std::move(c), restart_policy(mode, limits), now, {}, false});
  }
  thread_ = std::thread([this] { watch(); });
}

node_supervisor::~node_supervisor() { stop(); }

void node_supervisor::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> node_supervisor::down() const {
  std::lock_guard lock(mutex_);
  return down_;
}

void node_supervisor::leave_down(watched& w) {
  w.down = true;
  std::lock_guard lock(mutex_);
  down_.push_back(w.child.spec.name);
}

void node_supervisor::watch() {
  using clock = std::chrono::steady_clock;
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, watch_interval, [this] { return stopping_; })) {
    lock.unlock();
    const std::vector<child_state> states = launcher_.children();
    const auto now = clock::now();
    for (watched& w : children_) {
      if (w.down || launcher_.stopping()) continue;
      if (w.restart_at) {
        if (now < *w.restart_at) continue;
        w.restart_at.reset();
        try {
          const pid_t pid = launcher_.start(w.child.spec);
          if (pid < 0) continue;  // launch is stopping
          w.child.pid = pid;
          w.started = clock::now();
        } catch (const std::exception& e) {
          // Counted as a failed run: the policy backs off and gives up in time.
          spdlog::error("cannot restart {}: {}", w.child.spec.name, e.what());
          w.child.pid = -1;
          w.started = now;
          const restart_decision d = w.policy.after_exit(true, {}, now);
          if (d.what == restart_decision::action::restart) {
            w.restart_at = now + d.delay;
          } else {
            spdlog::error("giving up on {}: {}; it stays down", w.child.spec.name, d.why);
            leave_down(w);
          }
        }
        continue;
      }
      const child_state* state = nullptr;
      for (const child_state& s : states) {
        if (s.pid == w.child.pid) state = &s;
      }
      if (!state || !state->exited) continue;
      const restart_decision d = w.policy.after_exit(state->failed, now - w.started, now);
      switch (d.what) {
        case restart_decision::action::restart:
          spdlog::warn("restarting {} in {} ms (restart = \"{}\"; it ended with {})", w.child.spec.name,
                       d.delay.count(), restart_mode_name(w.child.mode), state->exit_status);
          w.restart_at = now + d.delay;
          break;
        case restart_decision::action::stay_down:
          spdlog::warn("{} stays down: {}", w.child.spec.name, d.why);
          leave_down(w);
          break;
        case restart_decision::action::give_up:
          spdlog::error("giving up on {}: {}; it stays down", w.child.spec.name, d.why);
          leave_down(w);
          break;
      }
    }
    lock.lock();
  }
}

}  // namespace troupe
