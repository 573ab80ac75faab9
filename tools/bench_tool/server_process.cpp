#include "tools/bench_tool/server_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace troupe::bench_tool {

namespace {
// The process group of the server running now (0: none), for signal_running_server.
std::atomic<pid_t> running_group{0};
}  // namespace

void signal_running_server() {
  const pid_t group = running_group.load();
  if (group > 0) ::kill(-group, SIGTERM);
}

server_process::server_process(const std::string& command, const std::string& log_path) {
  const std::string shell = "exec " + command;  // the server itself leads the group, not a shell
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("cannot fork to start the server command: " + command);
  if (pid_ == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      if (fd > STDERR_FILENO) ::close(fd);
    }
    ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first, the group exists before any signal
  running_group = pid_;
}

server_process::~server_process() { stop(); }

bool server_process::alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
  pid_ = -1;
  return false;
}

bool server_process::wait_until_ready(const std::function<bool()>& answers, std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (alive() && std::chrono::steady_clock::now() < deadline) {
    if (answers()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

void server_process::stop() {
  if (pid_ <= 0) return;
  running_group = 0;
  ::kill(-pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {  // 10 s for a graceful stop
    if (::waitpid(pid_, &status, WNOHANG) != 0) {
      ::kill(-pid_, SIGKILL);  // anything it started and left behind
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string substitute(const std::string& command, const std::string& value) {
  std::string out;
  for (size_t i = 0; i < command.size(); ++i) {
    if (command.compare(i, 2, "{}") == 0) {
      out += value;
      ++i;
    } else {
      out += command[i];
    }
  }
  return out;
}

}  // namespace troupe::bench_tool
