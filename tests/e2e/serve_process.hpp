#pragma once
// Starts a real `troupe serve` process on a free port for end-to-end tests and stops it after,
// and the client-side helpers the serve tests share.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {

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
      : api_key_(std::move(api_key)), port_(free_tcp_port()) {
    std::vector<std::string> args = {troupe_binary.string(), "serve", "--model", stories_dir,
                                     "--port", std::to_string(port_), "--threads", "1",
                                     "--log-level", "warn"};
    if (!api_key_.empty()) {
      args.push_back("--api-key");
      args.push_back(api_key_);
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    process_.emplace(std::move(args));
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

  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  const std::string& api_key() const { return api_key_; }
  client make_client() const { return client(endpoint(), api_key_); }

  bool alive() const { return process_ && process_->alive(); }
  void stop() {
    if (process_) process_->stop();
  }

 private:
  std::string api_key_;
  int port_ = 0;
  std::optional<child_process> process_;
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
  // The scheduler frees a request's blocks before its final delta has passed the detokenizer
  // and the frontend, which release its in-flight slot, so all four are waited for.
  while ((s.num_running != 0 || s.num_waiting != 0 || s.num_free_blocks != s.num_total_blocks ||
          s.num_requests_in_flight != 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = c.stats();
  }
  return s;
}

// Sends each request from its own client thread, all at once; a request that fails is a test
// failure naming it, and leaves its completion empty.
inline std::vector<completion> serve_together(const serve_process& server,
                                              const std::vector<generate_request>& requests) {
  std::vector<completion> outputs(requests.size());
  std::vector<std::string> errors(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        client c = server.make_client();
        c.set_timeout(std::chrono::seconds(60));  // generous: 2 cores shared with builds
        outputs[i] = c.generate(requests[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "request " << i;
  return outputs;
}

}  // namespace troupe::test
