#pragma once
// `troupe stage` as a child process for the pipeline tests (issue 27): a model's earlier layers
// served to the engine that holds the rest. On a port of its own choosing (read from its log), or
// on one the test chose, so that a stage killed with SIGKILL can be started again on the same
// endpoint and the engine's link reconnect to it. Stopped when its object ends; every wait is
// bounded.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {

class stage_process {
 public:
  // `port` 0: any free one. `extra_args` go after the stage's own (credentials, KV dtype, ...).
  explicit stage_process(std::string layers, std::string model = stories_dir, std::vector<std::string> extra_args = {},
                         uint16_t port = 0)
      : layers_(std::move(layers)), model_(std::move(model)), extra_args_(std::move(extra_args)), port_(port) {
    start();
  }
  stage_process(const stage_process&) = delete;
  stage_process& operator=(const stage_process&) = delete;
  ~stage_process() {
    if (process_) process_->stop();
    std::error_code ignored;
    for (const auto& log : logs_) std::filesystem::remove(log, ignored);
  }

  // Starts the stage (again) and waits, bounded, until it logs its endpoint; throws with its log
  // when it exits first or the bound passes. A restart on a chosen port keeps the endpoint.
  void start() {
    if (process_ && process_->alive()) throw std::logic_error("stage " + layers_ + " runs already");
    // Named by this object too: two stages of the same layers (a pipelined prefill's and its
    // decode's) must not read each other's endpoint.
    static std::atomic<int> next_instance{0};
    if (instance_ < 0) instance_ = next_instance++;
    const std::filesystem::path log = std::filesystem::temp_directory_path() /
                                      ("troupe_stage_" + std::to_string(::getpid()) + "_" + std::to_string(instance_) +
                                       "_" + layers_ + "." + std::to_string(logs_.size()) + ".log");
    logs_.push_back(log);
    std::vector<std::string> args = {
        troupe_binary.string(), "stage", "--model", model_, "--layers", layers_, "--threads", "1",
        "--log-level",          "info"};
    if (port_ != 0) args.insert(args.end(), {"--port", std::to_string(port_)});
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    process_.emplace(std::move(args), log);
    static const std::regex listening(
        R"(listening on ((?:kvtcp://127\.0\.0\.1:[0-9]+|curve://127\.0\.0\.1:[0-9]+/\S{40})))");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int i = 0; i < 3000 && process_->alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      std::smatch m;
      const std::string text = read_file(log);
      if (std::regex_search(text, m, listening)) {
        endpoint_ = m[1];
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string text = read_file(log);
    process_->stop();
    throw std::runtime_error("troupe stage " + layers_ + " did not come up; its log:\n" + text);
  }

  // SIGKILL: no goodbye to the engine; reaped before this returns.
  void kill9() {
    if (!process_ || !process_->alive()) return;
    ::kill(process_->pid(), SIGKILL);
    process_->stop();  // reaps it (SIGTERM to a dead pid is harmless before waitpid)
  }
  // SIGKILL, not reaped (the tests that only need it gone).
  void kill_now() { ::kill(process_->pid(), SIGKILL); }

  bool alive() const { return process_ && process_->alive(); }
  // Its process id while it runs (for /proc); -1 once reaped.
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  const std::string& layers() const { return layers_; }
  const std::string& endpoint() const { return endpoint_; }
  // What --pipeline-stage takes: ENDPOINT@LAYERS.
  std::string argument(const std::string& layers) const { return endpoint_ + "@" + layers; }
  std::string argument() const { return argument(layers_); }
  // The latest start's log.
  std::string log() const { return logs_.empty() ? std::string() : read_file(logs_.back()); }

 private:
  std::string layers_;
  std::string model_;
  std::vector<std::string> extra_args_;
  int instance_ = -1;  // names its logs
  uint16_t port_;
  std::vector<std::filesystem::path> logs_;
  std::optional<child_process> process_;
  std::string endpoint_;
};

}  // namespace troupe::test
