#pragma once
// What the end-to-end tests share (tests/e2e, and the GPU ones in tests/cuda that run the real
// binary): where the binary and the stories260K model are, a command run through the shell with
// its output captured, a child process that cannot outlive its test, and the model's reference
// continuations.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/free_port.hpp"
#include "tests/shared_models.hpp"

namespace troupe::test {

inline const std::filesystem::path troupe_binary = std::filesystem::path(TROUPE_BINARY_DIR) / "bin" / "troupe";
// stories260K in all its forms: hf/, gguf/, and refs.json with the reference continuations.
inline const std::filesystem::path stories_root = stories260k_dir;
inline const std::string stories_dir = (stories_root / "hf").string();

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct run_result {
  int exit_code = -1;  // -1: the shell could not start or the command died of a signal
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh with `input` on its stdin (empty: no input at all). Its stdout
// and stderr come back apart; a redirection inside the command (2>&1) still applies to it.
inline run_result run_command(const std::string& command, const std::string& input = {}) {
  // Unique per call: tests of one binary may run commands from several threads.
  static std::atomic<int> num_runs{0};
  const std::string scratch = (std::filesystem::temp_directory_path() /
                               ("troupe_e2e_" + std::to_string(::getpid()) + "_" + std::to_string(num_runs++)))
                                  .string();
  const std::string in_path = scratch + ".in";
  const std::string err_path = scratch + ".err";
  std::ofstream(in_path, std::ios::binary) << input;
  const std::string shell = "{ " + command + "\n} <" + shell_quote(in_path) + " 2>" + shell_quote(err_path);
  run_result r;
  if (FILE* pipe = ::popen(shell.c_str(), "r")) {
    std::array<char, 4096> buffer{};
    size_t n = 0;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
    const int status = ::pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = read_file(err_path);
  }
  std::filesystem::remove(in_path);
  std::filesystem::remove(err_path);
  return r;
}

// The troupe binary with `args`, quoted by the caller where they need it.
inline run_result run_troupe(const std::string& args, const std::string& input = {}) {
  return run_command(shell_quote(troupe_binary.string()) + " " + args, input);
}

// A program started without a shell, stopped (SIGTERM, then SIGKILL) when it goes out of scope,
// so a failed assertion never leaves a server running. With `output`, its stdout and stderr go
// to that file (created or truncated), where a test can read what it logged.
class child_process {
 public:
  explicit child_process(std::vector<std::string> args, const std::filesystem::path& output = {}) {
    if (args.empty()) throw std::invalid_argument("child_process: no program to run");
    // Everything the child needs is made before fork: after it, only async-signal-safe calls.
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string output_path = output.string();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("child_process: fork failed for " + args[0]);
    if (pid_ == 0) {
      if (!output_path.empty()) {
        const int fd = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0 || ::dup2(fd, STDERR_FILENO) < 0) _exit(126);
        if (fd > STDERR_FILENO) ::close(fd);
      }
      ::execv(argv[0], argv.data());
      _exit(127);
    }
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() { stop(); }

  // The child's process id while it runs (for /proc); -1 once it has been reaped.
  pid_t pid() const { return pid_; }
  bool alive() const {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
    pid_ = -1;  // reaped: its id may be reused, so it must never be signalled again
    status_ = status;
    return false;
  }
  // How it ended (a waitpid status), once alive() or stop() has reaped it; -1 before.
  int exit_status() const { return status_; }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;
        status_ = status;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    status_ = status;
  }

 private:
  mutable pid_t pid_ = -1;
  mutable int status_ = -1;
};

// refs.json's references: prompt, input_ids, completion, generated_ids, max_new_tokens (greedy).
inline nlohmann::json stories_references() {
  std::ifstream in(stories_root / "refs.json");
  if (!in) throw std::runtime_error("cannot open " + (stories_root / "refs.json").string());
  return nlohmann::json::parse(in).at("references");
}

inline nlohmann::json stories_reference(const std::string& prompt) {
  for (const auto& ref : stories_references()) {
    if (ref.at("prompt") == prompt) return ref;
  }
  throw std::runtime_error("refs.json has no reference for the prompt " + prompt);
}

// A loopback port free now (net/free_port.hpp), for a process started moments later.
inline uint16_t free_port() { return free_loopback_port(); }

// Each child `troupe launch` started, by name, with its latest pid: from its `started NAME (pid
// N)` lines in `log`.
inline std::map<std::string, pid_t> launched_pids_in(const std::string& log) {
  static const std::regex started(R"(started ([A-Za-z0-9._-]+) \(pid ([0-9]+)\))");
  std::map<std::string, pid_t> pids;
  for (std::sregex_iterator i(log.begin(), log.end(), started), end; i != end; ++i) {
    pids[(*i)[1]] = static_cast<pid_t>(std::stoi((*i)[2]));
  }
  return pids;
}

// A socket listening on 127.0.0.1 for the test's length that never accepts: its port is taken,
// and a peer's TCP connection completes (the kernel's backlog) but nothing ever answers on it.
class silent_listener {
 public:
  silent_listener() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd_, 4) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("silent_listener: cannot listen on 127.0.0.1:0");
    }
    port_ = ntohs(address.sin_port);
  }
  ~silent_listener() { ::close(fd_); }
  silent_listener(const silent_listener&) = delete;
  silent_listener& operator=(const silent_listener&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_ = 0;
};

}  // namespace troupe::test
