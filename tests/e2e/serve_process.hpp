#pragma once
// Starts a real `troupe serve` process on a free port for end-to-end tests and stops it after.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/client/client.hpp"

namespace troupe::test {

inline const std::string stories_dir = TROUPE_SHARED_DIR "/models/stories260K/hf";

inline int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

class serve_process {
 public:
  explicit serve_process(std::vector<std::string> extra_args, std::string api_key = {})
      : api_key_(std::move(api_key)) {
    port_ = free_tcp_port();
    std::vector<std::string> args = {TROUPE_BINARY_DIR "/bin/troupe", "serve", "--model", stories_dir,
                                     "--port", std::to_string(port_), "--threads", "1",
                                     "--log-level", "warn"};
    if (!api_key_.empty()) {
      args.push_back("--api-key");
      args.push_back(api_key_);
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    // Ready when it answers a stats request.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      client c(endpoint(), api_key_);
      c.set_timeout(std::chrono::milliseconds(300));
      try {
        c.stats();
        return;
      } catch (const std::exception&) {
      }
      if (!alive()) break;
    }
    stop();
    throw std::runtime_error("troupe serve did not come up on " + endpoint());
  }
  ~serve_process() { stop(); }

  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  const std::string& api_key() const { return api_key_; }
  client make_client() const { return client(endpoint(), api_key_); }

  bool alive() const {
    if (pid_ <= 0) return false;
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  std::string api_key_;
  int port_ = 0;
  pid_t pid_ = -1;
};

inline generate_request greedy(const std::string& prompt, int max_tokens) {
  generate_request r;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Waits until the server holds no request and every KV block is free again.
inline stats_reply wait_until_idle(client& c, std::chrono::milliseconds within = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  stats_reply s = c.stats();
  while ((s.num_running != 0 || s.num_waiting != 0 || s.num_free_blocks != s.num_total_blocks) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = c.stats();
  }
  return s;
}

}  // namespace troupe::test
