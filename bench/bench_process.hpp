#pragma once
// Child processes for the benchmarks and the abuse suite that start a whole cluster: a process
// with its output in a file, stopped (SIGTERM, then SIGKILL) when it goes out of scope, and taken
// along by PR_SET_PDEATHSIG when the parent dies without cleanup; a free loopback port; a file's
// text.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "net/free_port.hpp"

namespace troupe::bench {

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A loopback port free now (net/free_port.hpp), for a process started moments later.
inline uint16_t free_port() { return free_loopback_port(); }

struct child_options {
  rlim_t max_open_files = 0;  // RLIMIT_NOFILE for the child (and its children); 0: inherited
};

class child {
 public:
  child(std::vector<std::string> args, const std::filesystem::path& log, child_options options = {}) : log_(log) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log_path = log.string();
    const pid_t parent = ::getpid();
    const rlimit files{options.max_open_files, options.max_open_files};
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed for " + args[0]);
    if (pid_ == 0) {  // only async-signal-safe calls from here on
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(125);
      if (options.max_open_files > 0 && ::setrlimit(RLIMIT_NOFILE, &files) != 0) _exit(124);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0 || ::dup2(fd, STDERR_FILENO) < 0) _exit(126);
      if (fd > STDERR_FILENO) ::close(fd);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child() { stop(); }

  pid_t pid() const { return pid_; }
  bool alive() {
    if (pid_ <= 0) return false;
    if (::waitpid(pid_, &status_, WNOHANG) == 0) return true;
    pid_ = -1;  // reaped: the id may be reused, never signal it again
    return false;
  }
  // The wait status once reaped (alive() returned false), as waitpid gives it.
  int status() const { return status_; }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    pid_ = -1;
  }
  // SIGTERM, then SIGKILL after `grace`; whether it exited within the grace.
  bool stop(std::chrono::milliseconds grace = std::chrono::seconds(10)) {
    if (pid_ <= 0) return true;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (int i = 0; i < 100000 && std::chrono::steady_clock::now() < deadline; ++i) {
      if (::waitpid(pid_, &status_, WNOHANG) != 0) {
        pid_ = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill_now();
    return false;
  }
  std::string log() const { return read_text(log_); }

  // User + system CPU seconds the process has used so far (/proc/PID/stat), 0 once it is gone.
  double cpu_seconds() const {
    if (pid_ <= 0) return 0;
    const std::string text = read_text("/proc/" + std::to_string(pid_) + "/stat");
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) return 0;
    std::istringstream rest(text.substr(paren + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 13 && rest >> field; ++i) {
    }
    rest >> utime >> stime;
    return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

  // Waits (`bound` at most) until the log holds `text`; throws with the log's tail when the
  // process ends first or the bound passes.
  void wait_for(const std::string& text, const std::string& what,
                std::chrono::milliseconds bound = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (int i = 0; i < 100000 && std::chrono::steady_clock::now() < deadline; ++i) {
      if (log().find(text) != std::string::npos) return;
      if (!alive()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string text_now = log();
    throw std::runtime_error(what + (alive() ? " did not log \"" : " exited before it logged \"") + text +
                             "\"; log:\n" + text_now.substr(text_now.size() > 3000 ? text_now.size() - 3000 : 0));
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int status_ = 0;
};

// `troupe certs` into `dir`/certs for the cluster's members `names` (the controller among them):
// waits for it (20 s at most) and throws with its log when it fails.
inline void make_cluster_certs(const std::string& troupe, const std::filesystem::path& dir,
                               const std::vector<std::string>& names) {
  std::vector<std::string> args{troupe, "certs", "--out", (dir / "certs").string()};
  for (const std::string& name : names) {
    args.push_back("--name");
    args.push_back(name);
  }
  child certs(args, dir / "certs.log");
  for (int i = 0; i < 1000 && certs.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (certs.alive() || !WIFEXITED(certs.status()) || WEXITSTATUS(certs.status()) != 0) {
    throw std::runtime_error("troupe certs failed: " + certs.log());
  }
}

}  // namespace troupe::bench
