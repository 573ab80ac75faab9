#pragma once
// The pipelined model's connection to one remote stage (pipeline/stage_server.hpp), with its own
// I/O thread: micro-batches queued on it are sent one at a time (one frame in flight, so neither
// side can block the other on a full socket), each answered frame's residual written where the
// micro-batch says, and the micro-batch handed on to the next link or back to the model. Links
// chained this way overlap: stage k works on micro-batch i + 1 while stage k + 1 works on i.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/forward_batch.hpp"
#include "model/layer_range.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_stage_pairs.hpp"
#include "pipeline/stage_channel.hpp"
#include "pipeline/stage_frame.hpp"

namespace troupe {

// One micro-batch of one forward on its way through the remote stages.
struct micro_batch_job {
  uint64_t step_id = 0;
  uint32_t index = 0;
  const forward_batch* batch = nullptr;  // its arrays (no logits rows: remote stages make none)
  // The residual stream between stages, [num_tokens, hidden]: `stream[0]` in, `stream[1]` out,
  // swapped after each stage so the next one reads what this one wrote.
  std::vector<float> stream[2];
  std::string failure;  // why a stage could not compute it; the rest of the chain passes it on
};

class stage_link {
 public:
  // Connects to `endpoint` (kvtcp:// or curve://, pipeline/stage_channel.hpp; curve:// with the
  // cluster's `keys`) and exchanges hellos: the stage must hold `layers` of a model with
  // `expected`'s shapes and KV block size. Throws std::runtime_error naming the endpoint and the
  // reason (no answer, a failure frame's text, a stage that is not the one expected).
  stage_link(std::string endpoint, layer_range layers, const stage_hello& expected,
             std::chrono::milliseconds connect_timeout, std::chrono::milliseconds step_timeout,
             const kv_channel_keys& keys = {});
  ~stage_link();
  stage_link(const stage_link&) = delete;
  stage_link& operator=(const stage_link&) = delete;

  // Where a micro-batch goes once this link is done with it (the next link, or the model).
  void hand_on_to(std::function<void(micro_batch_job*)> next) { next_ = std::move(next); }
  // Queues a micro-batch; it comes out through hand_on_to's function, computed or failed.
  void push(micro_batch_job* job);

  const std::string& endpoint() const { return endpoint_; }
  const layer_range& layers() const { return layers_; }
  // The blocks of the stage's KV pool (its hello's answer).
  int num_blocks() const { return num_blocks_; }
  // Why the link is down, or "" while it is up. A link that failed stays down: the stage's KV
  // for the steps it missed is gone, so a new connection could only compute wrong answers.
  std::string broken() const;
  // Moves the KV of some of the stage's layers (span.first_layer .. + num_layers, global layer
  // numbers) in `block_ids` out of its pool into `out` (kv_span_bytes(span) long, in
  // span.element) or into it from `data`. Sent by the link's thread between micro-batches, in
  // queue order; blocks until the stage answered. Why not, or "" (a stage's refusal leaves the
  // link up; a broken exchange breaks it).
  std::string export_kv(std::span<const int32_t> block_ids, const kv_span_header& span, std::span<std::byte> out);
  std::string import_kv(std::span<const int32_t> block_ids, const kv_span_header& span,
                        std::span<const std::byte> data);
  // The pair frames (pipeline/stage_pair_frames.hpp), sent like the KV frames above: a decode
  // stage's lease on a transfer's blocks, answered with its KV receiver's route; the lease's end.
  // Why not, or "".
  std::string lease_kv(const kv_stage_lease& lease, kv_stage_route& route);
  std::string release_kv(uint64_t transfer_id);
  // A prefill stage's push of its layers of one request to its decode peer, queued without
  // waiting for its answer (the link's thread sends it in queue order, so before any later
  // micro-batch); wait_pushes() waits for every push queued since its last call and returns the
  // first failure among them ("" when all went).
  void queue_push_kv(kv_stage_push push);
  std::string wait_pushes();
  // The stage's compute time its results reported since the last call (what it was busy with).
  uint64_t take_busy_ns() { return busy_ns_.exchange(0); }
  // The stage process's CPU as its last result reported it (pid 0: no result yet).
  struct process_cpu {
    uint32_t pid = 0;
    uint64_t total_us = 0;
    uint64_t compute_us = 0;
  };
  process_cpu stage_process_cpu() const;

  // How often an idle link looks whether its stage is still there (stage_channel::peer_gone).
  static constexpr std::chrono::milliseconds idle_probe_interval{250};

 private:
  // A KV export or import waiting for the link's thread.
  struct kv_job {
    stage_frame_kind kind = stage_frame_kind::kv_export;
    std::span<const int32_t> block_ids;
    kv_span_header span;
    std::span<std::byte> out;               // an export's
    std::span<const std::byte> data;        // an import's
    const kv_stage_lease* lease = nullptr;  // kind kv_lease
    const kv_stage_push* push = nullptr;    // kind kv_push
    uint64_t release = 0;                   // kind kv_release: the transfer
    kv_stage_route* route = nullptr;        // a lease's answer
    std::string failure;
    bool done = false;
  };
  // A queued push and its job, owned by the link until wait_pushes().
  struct owned_push {
    kv_stage_push push;
    kv_job job;
  };
  // What the link's thread takes next: a micro-batch or a KV job.
  struct queued {
    micro_batch_job* micro_batch = nullptr;
    kv_job* kv = nullptr;
  };

  void run();
  // Sends `job` to the stage and reads its answer into job->stream[1]; why not, or "".
  std::string exchange(micro_batch_job& job);
  // Sends a KV job and reads its answer; why not, or "".
  std::string exchange(kv_job& job);
  // Sends a pair frame and reads its answer; why not, or "".
  std::string exchange_pair(kv_job& job);
  // Queues `job` and waits until the link's thread has done it.
  std::string run_kv_job(kv_job& job);

  std::string endpoint_;
  layer_range layers_;
  int hidden_size_ = 0;
  int num_blocks_ = 0;
  int num_model_layers_ = 0;  // the whole model's (a lease's relay route names them all)
  std::chrono::milliseconds step_timeout_;
  std::unique_ptr<stage_channel> channel_;
  std::function<void(micro_batch_job*)> next_;
  std::vector<std::byte> head_;  // the frame's header and arrays, reused
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable kv_done_;
  std::deque<queued> queue_;
  std::vector<std::unique_ptr<owned_push>> pushes_;  // queued since the last wait_pushes()
  uint64_t kv_exchanges_ = 0;                        // numbers the KV frames (their step_id), so an answer is checked
  std::string broken_;
  bool stopping_ = false;
  std::atomic<uint64_t> busy_ns_{0};
  process_cpu stage_cpu_;  // under mutex_
  std::thread thread_;
};

}  // namespace troupe
