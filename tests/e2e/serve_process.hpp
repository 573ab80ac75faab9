#pragma once
// Starts a real `troupe serve` process for end-to-end tests and stops it after, and the
// client-side helpers the serve tests share. The server chooses its own ports (a ZeroMQ wildcard
// endpoint, HTTP port 0) and the test reads them from its log: a port the test picked and freed
// for the child could be taken by another process in between.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {

// `troupe serve` on stories260K with one compute thread, its ZeroMQ door on a port of its own
// choosing (and, when the arguments turn the HTTP API on, its HTTP door too), logging at info
// level to a file this object reads the bound ports from and removes.
//
// extra_args: more flags for `troupe serve`; they must not set --log-level, --port or
// --zmq-endpoint (the ports are read from the info-level log). api_key: the key clients send;
// it is passed as --api-key unless extra_args give --api-key-file.
class serve_process {
 public:
  // model: the HF directory (or .gguf) to serve; stories260K unless told.
  explicit serve_process(std::vector<std::string> extra_args, std::string api_key = {}, std::string model = stories_dir)
      : api_key_(std::move(api_key)), log_path_(unique_log_path()) {
    for (const char* owned : {"--log-level", "--port", "--zmq-endpoint"}) {
      if (std::find(extra_args.begin(), extra_args.end(), owned) != extra_args.end()) {
        throw std::invalid_argument(std::string("serve_process sets ") + owned +
                                    " itself; remove it from the arguments");
      }
    }
    const bool key_file = std::find(extra_args.begin(), extra_args.end(), "--api-key-file") != extra_args.end();
    const bool http = wants_http(extra_args);
    std::vector<std::string> args = {troupe_binary.string(), "serve",     "--model", model,         "--zmq-endpoint",
                                     "tcp://127.0.0.1:*",    "--threads", "1",       "--log-level", "info"};
    if (!api_key_.empty() && !key_file) {
      args.push_back("--api-key");
      args.push_back(api_key_);
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    // `troupe serve` opens HTTP on port 8000 unless told: tests that do not ask for it keep it off,
    // so that servers running side by side do not compete for the port.
    if (!http && std::find(extra_args.begin(), extra_args.end(), "--http") == extra_args.end()) {
      args.insert(args.end(), {"--http", "off"});
    }
    process_.emplace(std::move(args), log_path_);

    // Up when it has logged its ports and answers a stats request; loading the model on a
    // loaded machine may take a while, so the bound is generous, and a server that exits ends
    // the wait at once.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    static const std::regex zmq_line(R"(zmq door: listening on (tcp://127\.0\.0\.1:[0-9]+))");
    static const std::regex http_line(R"(HTTP API on http://[^ :]+:([0-9]+)/v1)");
    for (int i = 0; i < 3000 && alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      const std::string log = read_file(log_path_);
      std::smatch m;
      if (endpoint_.empty() && std::regex_search(log, m, zmq_line)) endpoint_ = m[1];
      if (http && http_port_ == 0 && std::regex_search(log, m, http_line)) http_port_ = std::stoi(m[1]);
      if (!endpoint_.empty() && (!http || http_port_ != 0)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int i = 0; i < 200 && !endpoint_.empty() && alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      client c(endpoint_, api_key_);
      c.set_timeout(std::chrono::milliseconds(300));
      try {
        c.stats();
        return;
      } catch (const std::exception&) {
      }
    }
    const std::string log = read_file(log_path_);
    stop();
    throw std::runtime_error(
        "troupe serve did not come up (" +
        std::string(endpoint_.empty() ? "no ZeroMQ endpoint logged" : "no answer on " + endpoint_) +
        (http && http_port_ == 0 ? ", no HTTP port logged" : "") + "); its log:\n" + log);
  }
  serve_process(const serve_process&) = delete;
  serve_process& operator=(const serve_process&) = delete;
  ~serve_process() {
    stop();
    std::error_code ignored;
    std::filesystem::remove(log_path_, ignored);
  }

  // The ZeroMQ endpoint the server bound, e.g. tcp://127.0.0.1:41873.
  std::string endpoint() const { return endpoint_; }
  // The HTTP API's port; 0 when the arguments did not turn the API on.
  int http_port() const { return http_port_; }
  const std::string& api_key() const { return api_key_; }
  client make_client() const { return client(endpoint(), api_key_); }
  // Everything the server has logged so far (info level and up).
  std::string log() const { return read_file(log_path_); }

  bool alive() const { return process_ && process_->alive(); }
  // How it ended (a waitpid status) once alive() or stop() has seen it gone; -1 before.
  int exit_status() const { return process_ ? process_->exit_status() : -1; }
  // The server's process id, for reading /proc; -1 when it is not running.
  pid_t pid() const { return alive() ? process_->pid() : -1; }
  void stop() {
    if (process_) process_->stop();
  }

 private:
  static bool wants_http(const std::vector<std::string>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--http-port") return true;
      if (args[i] == "--http" && i + 1 < args.size() && args[i + 1] == "on") return true;
    }
    return false;
  }

  static std::filesystem::path unique_log_path() {
    static std::atomic<int> num_servers{0};
    return std::filesystem::temp_directory_path() /
           ("troupe_serve_" + std::to_string(::getpid()) + "_" + std::to_string(num_servers++) + ".log");
  }

  std::string api_key_;
  std::filesystem::path log_path_;
  std::string endpoint_;
  int http_port_ = 0;
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
