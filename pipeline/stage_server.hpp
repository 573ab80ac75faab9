#pragma once
// Serves one pipeline stage of a model to the pipelined model that drives it
// (pipeline/pipelined_model.hpp), frame by frame (pipeline/stage_frame.hpp) over a stage channel
// (pipeline/stage_channel.hpp): plain TCP on loopback without keys, ZeroMQ with CURVE with the
// cluster's keys (any host; only members get in). One link at a time. A hello (checked against
// the stage: layers, shapes, block size) starts a link and is answered; then each work frame is
// computed in arrival order and answered with the residual stream leaving the stage, or with a
// failure naming what was wrong (the link stays usable when the frame was read whole; over plain
// TCP a header that cannot be trusted ends the connection).
//
// KV frames move the KV of this stage's layers between its pool and the driver (a pipelined
// prefill exports it, a pipelined decode imports it), checked against the pool before a byte of
// data is read.
//
// Pair frames (kv_lease, kv_release, kv_push) give each pair of a prefill's and a decode's stages
// their own KV channel (pipeline/stage_kv_pairs.hpp): made at the first such frame.
//
// The stage's KV lives here, in the blocks the driving scheduler names: a driver that
// reconnects after losing its link finds the KV of its old steps, which it must not trust (the
// pipelined model never reconnects).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/process_cpu.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"
#include "pipeline/stage_channel.hpp"
#include "pipeline/stage_frame.hpp"
#include "pipeline/stage_kv_pairs.hpp"

namespace troupe {

struct stage_server_settings {
  // Where to listen (port 0: an ephemeral port). Without keys, plain TCP carries no credentials,
  // so only a loopback host is accepted.
  std::string host = "127.0.0.1";
  int port = 0;
  stage_frame_limits limits;  // hidden_size is the model's
  // How long a frame may take to arrive once its first byte has, and how long a write may wait.
  std::chrono::milliseconds stall_timeout{30000};
  // The cluster's CURVE keys (kv_channel_keys, from `troupe certs`): the stage serves curve://.
  kv_channel_keys keys;
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

  // "kvtcp://HOST:PORT" or "curve://HOST:PORT/KEY", what a pipelined model connects to.
  const std::string& endpoint() const { return endpoint_; }
  uint64_t frames_computed() const { return frames_computed_.load(); }
  uint64_t frames_refused() const { return frames_refused_.load(); }
  // KV exports and imports answered.
  uint64_t kv_frames() const { return kv_frames_.load(); }
  // Time spent computing frames (the stage's busy share over a wall-clock interval).
  uint64_t busy_ns() const { return busy_ns_.load(); }
  // What went over this stage's own KV channel (zeros before the first pair frame).
  stage_kv_pairs_stats kv_pair_stats() const;

 private:
  void serve();
  // Serves frames from `channel` until it fails, closes, or the server stops. `framed`: each
  // frame is a message of its own (ZeroMQ), so a bad header does not end the link.
  void serve_link(stage_channel& channel, bool framed);
  // Answers a hello: true (after an ack) when the stage is what the link expects.
  bool greet(stage_channel& channel, const stage_frame_header& header);
  void compute(stage_channel& channel, const stage_frame_header& header);
  // Answers a kv_export with kv_data or a kv_import with kv_done, or refuses it by name.
  void move_kv(stage_channel& channel, const stage_frame_header& header);
  // Answers a kv_lease with kv_lease_ack, a kv_release or kv_push with kv_done, or refuses it.
  void pair_kv(stage_channel& channel, const stage_frame_header& header);
  // Reads and drops `bytes` of the current frame's payload (a refused import's data, so that a
  // stream stays in step); why not, or "".
  std::string skip(stage_channel& channel, uint64_t bytes);
  bool send(stage_channel& channel, const stage_frame_header& header, std::span<const std::byte> payload);
  // The process's CPU since the stage began serving, read again at most every
  // cpu_refresh_interval (a result frame carries it).
  process_cpu_time process_cpu_now();
  void send_failure(stage_channel& channel, const stage_frame_header& about, const std::string& why);

  model& stage_;
  layer_range layers_;
  stage_server_settings settings_;
  stage_frame_limits limits_;
  std::string endpoint_;
  int listener_ = -1;                     // plain TCP
  std::unique_ptr<stage_channel> curve_;  // CURVE: the one bound socket
  // One frame's buffers, reused.
  forward_batch batch_;
  std::vector<std::byte> arrays_;
  std::vector<float> residual_in_, residual_out_;  // [num_tokens, hidden] each
  std::vector<std::byte> kv_data_;                 // a KV frame's span
  std::unique_ptr<stage_kv_pairs> pairs_;          // made by the first pair frame
  mutable std::mutex pairs_mutex_;                 // pairs_ itself, for kv_pair_stats()
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> frames_computed_{0};
  std::atomic<uint64_t> frames_refused_{0};
  std::atomic<uint64_t> kv_frames_{0};
  std::atomic<uint64_t> busy_ns_{0};
  static constexpr std::chrono::milliseconds cpu_refresh_interval{250};
  process_cpu_time cpu_;  // the last reading (the serving thread's alone)
  std::chrono::steady_clock::time_point cpu_read_at_{};
  std::thread thread_;
};

// True for a host a plain (unauthenticated) link may listen on: loopback only.
bool is_loopback_host(const std::string& host);

}  // namespace troupe
