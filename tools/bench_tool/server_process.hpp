#pragma once
// A server the bench starts itself (--server-cmd): a shell command run in a process group of its
// own, its output to a log file, stopped (SIGTERM to the group, then SIGKILL) when this object
// goes, so a sweep never leaves a server behind, also when the bench fails.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

namespace troupe::bench_tool {

class server_process {
 public:
  server_process(const std::string& command, const std::string& log_path);
  ~server_process();
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  // Polls `answers` until it says yes (true), the process exits or `within` passes (false).
  bool wait_until_ready(const std::function<bool()>& answers, std::chrono::seconds within);
  bool alive();
  void stop();

 private:
  pid_t pid_ = -1;
};

// From a signal handler (async-signal-safe): SIGTERM to the process group of the server running
// now, if any, so that a bench stopped by Ctrl-C leaves nothing behind.
void signal_running_server();

// The command with every "{}" replaced by value.
std::string substitute(const std::string& command, const std::string& value);

}  // namespace troupe::bench_tool
