#pragma once
// Serves one pipeline stage of a model to the pipelined model that drives it
// (pipeline/pipelined_model.hpp) over plain TCP (pipeline/stage_frame.hpp has the frames).
// One link at a time: its hello is checked against the stage (layers, shapes, enough KV blocks)
// and answered; then each work frame is computed in arrival order and answered with the residual
// stream leaving the stage, or with a failure naming what was wrong (the connection stays usable
// when the frame was read whole; a header that cannot be trusted ends the connection). A new
// link replaces nothing: the next one is accepted when the current one closes.
//
// The stage's KV lives here, in the blocks the driving scheduler names: a driver that
// reconnects after losing its link finds the KV of its old steps, which it must not trust (the
// pipelined model never reconnects; failover re-places the whole instance).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "model/layer_range.hpp"
#include "model/model.hpp"
#include "pipeline/stage_frame.hpp"

namespace troupe {

struct stage_server_settings {
  // Where to listen. Plain TCP carries no credentials, so a non-loopback host is refused until the
  // link is authenticated (CURVE, as the KV plane's); port 0: an ephemeral port.
  std::string host = "127.0.0.1";
  int port = 0;
  stage_frame_limits limits;  // hidden_size is the model's
  // How long a frame may take to arrive once its first byte has, and how long a write may wait.
  std::chrono::milliseconds stall_timeout{30000};
};

class stage_server {
 public:
  // Listens at once and serves on its own thread until destroyed. `stage` (a model built for a
  // stage before the last: model/layer_range.hpp) must outlive the server. Throws
  // std::runtime_error naming the host or port that cannot be bound.
  stage_server(model& stage, layer_range layers, stage_server_settings settings);
  ~stage_server();
  stage_server(const stage_server&) = delete;
  stage_server& operator=(const stage_server&) = delete;

  // "kvtcp://HOST:PORT", what a pipelined model connects to.
  const std::string& endpoint() const { return endpoint_; }
  uint64_t frames_computed() const { return frames_computed_.load(); }
  uint64_t frames_refused() const { return frames_refused_.load(); }
  // Time spent computing frames (the stage's busy share over a wall-clock interval).
  uint64_t busy_ns() const { return busy_ns_.load(); }

 private:
  void serve();
  void serve_link(int fd);
  // Answers a link's hello: false (after a failure frame) when the stage is not what it expects.
  bool greet(int fd);
  bool send(int fd, const stage_frame_header& header, std::span<const std::byte> payload);
  void send_failure(int fd, const stage_frame_header& about, const std::string& why);

  model& stage_;
  layer_range layers_;
  stage_server_settings settings_;
  stage_frame_limits limits_;
  std::string endpoint_;
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> frames_computed_{0};
  std::atomic<uint64_t> frames_refused_{0};
  std::atomic<uint64_t> busy_ns_{0};
  std::thread thread_;
};

// True for a host a plain (unauthenticated) link may listen on: loopback only.
bool is_loopback_host(const std::string& host);

}  // namespace troupe
