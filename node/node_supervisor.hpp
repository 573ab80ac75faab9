#pragma once
// Restarts the nodes `troupe launch` started when they die (issue 26): a thread that watches the
// launcher's children every 100 ms and, for a child that ended on its own, does what its
// restart_policy decides (start it again after the back-off, leave it down, or give up and say
// so). The decisions are the policy's; this is the loop around them. The controller places the
// node's stages on it again by itself, as for any node that comes back (node/remote_node.hpp).

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "node/node_launcher.hpp"
#include "node/restart_policy.hpp"

namespace troupe {

// A child the supervisor looks after: how to start it and when to do it again.
struct supervised_child {
  child_spec spec;
  restart_mode mode = restart_mode::on_failure;
  pid_t pid = -1;  // the running process launcher.start() returned
};

class node_supervisor {
 public:
  // Watches `children` (already started by `launcher`, which must outlive this) from a thread of
  // its own. Restarts are forked from that thread, so their parent-death signal (PR_SET_PDEATHSIG)
  // is tied to it: call launcher.stop() before this ends (the launcher refuses starts once it
  // stops, and this sees that).
  node_supervisor(node_launcher& launcher, std::vector<supervised_child> children, restart_limits limits = {});
  ~node_supervisor();  // stop()
  node_supervisor(const node_supervisor&) = delete;
  node_supervisor& operator=(const node_supervisor&) = delete;

  // Ends the watching thread promptly (a pending restart is dropped); idempotent.
  void stop();

  // The children left down for good (their restart mode, or given up on), in the order they went.
  std::vector<std::string> down() const;

 private:
  struct watched;
  void watch();
  void leave_down(watched& w);

  node_launcher& launcher_;
  std::vector<watched> children_;  // only the watching thread touches them
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::string> down_;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace troupe
