#pragma once
// Starts, watches and stops the local processes of a topology (`troupe launch`): each child is
// forked and exec'd with its stdout and stderr on a pipe, whose lines the launcher forwards
// prefixed with the child's name and searches for the line that says the child is up.
//
// Children die with the launcher: each asks the kernel for SIGTERM when its parent dies
// (PR_SET_PDEATHSIG), so a launcher killed with SIGKILL leaves no node behind. The kernel sends
// that signal when the *thread* that forked the child ends, so call start() from a thread that
// outlives the children (`troupe launch` uses its main thread). Children run in a process group
// of their own: a Ctrl-C on the terminal reaches only the launcher, which stops them in order.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "node/topology.hpp"

namespace troupe {

// One child process: what it runs and how the launcher knows it is up.
struct child_spec {
  std::string name;               // prefixes its log lines and names it in errors
  std::vector<std::string> argv;  // argv[0] is the program's path (no PATH search)
  std::string ready_text;         // a line of its output holding this means it is up
};

// What the launcher knows of one child.
struct child_state {
  std::string name;
  pid_t pid = -1;
  bool ready = false;
  bool exited = false;
  std::string exit_status;  // "exit code 3", "signal 9 (Killed)"; empty while it runs
  bool failed = false;      // exited with a non-zero code or by a signal
};

// The child that runs the [[nodes]] entry `address`: `BINARY node --listen HOST:PORT
// --credentials DIR --name NAME --log-level LEVEL`, up once it logs `node NAME listening on`.
child_spec node_child_spec(const node_address& address, const std::filesystem::path& credentials,
                           const std::filesystem::path& troupe_binary, const std::string& log_level);

// The child that runs the controller `name` (the topology's [cluster] name): `BINARY serve --config
// FILE SERVE-ARGS...`, up once its doors serve (it logs `serving: ZeroMQ on`, at info level).
child_spec controller_child_spec(const std::string& name, const std::filesystem::path& topology_file,
                                 const std::filesystem::path& troupe_binary,
                                 const std::vector<std::string>& serve_args);

// A child's output line as launch prints it: "NAME | line" in text; in JSON (launch's
// --log-format json, which its children were given too) the child's own JSON object with a "node"
// field added, or, for a line that is not one (a crash message), a JSON object holding it, so
// every line launch prints parses as JSON.
std::string label_child_line(const std::string& name, const std::string& line, bool json);

class node_launcher {
 public:
  // Receives each line the children print, already prefixed ("NAME | line"); calls are
  // serialized. The default writes to stderr.
  using line_sink = std::function<void(const std::string& line)>;

  explicit node_launcher(line_sink sink = {});
  ~node_launcher();  // stop() with the default grace period
  node_launcher(const node_launcher&) = delete;
  node_launcher& operator=(const node_launcher&) = delete;

  // Forks and execs the child; returns its pid, or -1 without starting it once stop() has begun
  // (a restart racing the end of launch). Throws std::runtime_error naming the child and the
  // program when it cannot be run (no such file, not executable).
  pid_t start(const child_spec& spec);

  // Waits until every started child has logged its ready text. Returns false, with the children
  // still running, as soon as `cancelled` (polled every 100 ms) says so. Throws
  // std::runtime_error naming the child and quoting its last lines when one exits before it is
  // ready or is not ready within `timeout`.
  bool wait_until_ready(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled = {});

  // SIGTERM to every child still running, SIGKILL to those still running after `grace`; returns
  // once all are reaped. A child that exits on its own before this is logged as a warning. Once
  // `hurry` (polled every 100 ms) says so, those still running get a second SIGTERM (a server's
  // second signal ends its drain at once).
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5), const std::function<bool()>& hurry = {});

  // Every child started, in order: a restarted one is a new entry, its earlier runs stay.
  std::vector<child_state> children() const;
  // True once stop() has begun.
  bool stopping() const;

 private:
  struct child;
  void forward_output(child& c);
  void emit(const std::string& line);

  line_sink sink_;
  std::mutex sink_mutex_;
  std::mutex start_mutex_;    // held across a start(); stop() takes it to set stopping_
  mutable std::mutex mutex_;  // guards every child's state and stopping_
  std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<child>> children_;
};

}  // namespace troupe
