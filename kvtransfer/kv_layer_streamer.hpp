#pragma once
// The prefill side's half of a KV transfer, on the worker: the serving kv_layer_sink
// (engine/kv_layer_sink.hpp, whose contract the model_runner keeps). While a step computes
// prefill-only requests (kv_role::send), each layer's K/V of those requests is exported the
// moment the layer has written it and queued on the KV sender, whose own thread puts it on the
// wire while the next layers compute. A chunked prompt streams chunk by chunk; the first chunk also carries the
// blocks the prefix cache supplied (they were never computed here, but the receiver needs them).
//
// Frames carry whole blocks from a block-aligned token: the block a chunk leaves partly filled
// is sent again, complete, with the next chunk. Once the chunk that reaches the prompt's end has
// gone out, the transfer is finished on the sender (its frames still drain).
//
// With a device path (kv_transport "cuda_ipc" or "nccl"), the bytes never touch the host: each
// layer's blocks are copied device to device into the decode side's reserved blocks (the
// destination its kv_ready named, taken from kv_device_destinations before the transfer's first
// step computes), and an in-place frame through the same sender tells the receiver's lease those
// tokens are in. CUDA IPC copies first, then queues the frame; NCCL queues the frame first (the
// receiver posts its receive when the frame arrives), then posts the send on the channel's own
// stream without waiting, and finish_step waits for the step's sends, bounded by each transfer's
// deadline. Chunks and prefix-cache blocks follow the same block ranges as the host path.
//
// A pipelined prefill whose decode peer is a pipeline cut at the same layers streams over a KV
// channel per pair of stages (kvtransfer/kv_stage_pairs.hpp): like the device path it takes the
// decode side's answer before the transfer's first step computes (the decode stages' receivers,
// or none), and then each remote stage's layers are pushed by that stage, once the step has left
// it, straight to the decode stage's receiver; only the layers held here go through the sender.
//
// Plain class, used by the model_runner on the worker's thread only; the worker builds it over
// the KV agent's sender and hands it to the runner (model_runner::stream_kv_to).

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include <memory>
#include <optional>

#include "engine/kv_layer_sink.hpp"
#include "engine/step_plan.hpp"
#include "kvtransfer/device_kv_copier.hpp"
#include "kvtransfer/kv_device_destinations.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "kvtransfer/kv_stage_pairs.hpp"
#include "model/model.hpp"

namespace troupe {

// A device transport's half on the prefill worker: both set, or neither (the host path).
struct kv_device_path {
  std::shared_ptr<device_kv_copier> copier;              // used on the forward's thread only
  std::shared_ptr<kv_device_destinations> destinations;  // filled by the worker's KV agent
  explicit operator bool() const { return copier && destinations; }
};

// A pipelined prefill's KV channels per pair of stages: both set, or neither.
struct kv_stage_pair_path {
  kv_stage_pairs* pairs = nullptr;                       // the model's remote stages
  std::shared_ptr<kv_device_destinations> destinations;  // the decode side's routes, from the KV agent
  explicit operator bool() const { return pairs && destinations; }
};

class kv_layer_streamer final : public kv_layer_sink {
 public:
  // `m` and `sender` must outlive this. A transfer whose destination is not known `timeout`
  // after it started, or that has not been sent whole `timeout` after its destination came, is
  // dropped by the sender (the receiver's own deadline fails it there). `device` set: the KV goes
  // device to device and the frames are in place.
  // `stage_pairs` set (not with `device`): a pipelined prefill waits for each transfer's routes.
  kv_layer_streamer(const model& m, kv_sender& sender, std::chrono::milliseconds timeout, kv_device_path device = {},
                    kv_stage_pair_path stage_pairs = {});

  // A plan entry started request `request_id` on the worker with a send transfer (again, after a
  // preemption: the transfer stays open and is sent again from its first token).
  void start(int64_t request_id, uint64_t transfer_id) override;
  // The request ended on the worker or was preempted. An ended request's transfer is cancelled
  // unless its last chunk went out; a preempted one starts over at start().
  void forget(int64_t request_id, bool preempted) override;

  // Before a step's forward: the entries of `plan` that stream (tables[i] is entry i's whole
  // block table). Returns whether any does (the forward then calls on_layer_written).
  bool prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) override;
  // Called on the forward's thread once layer `layer` of the step's batch is in the pool.
  void on_layer_written(int layer) override;
  // After the forward: every prepared entry's tokens are sent; a chunk that sampled was the last.
  void finish_step() override;

  // The requests it holds a stream for, until forget() (for tests).
  size_t num_streams() const { return streams_.size(); }

 private:
  struct stream {
    uint64_t transfer_id = 0;
    int32_t num_tokens_sent = 0;  // every layer holds tokens [0, this) on the sender's queue
    bool last_chunk_sent = false;
    bool broken = false;                             // the sender refused a frame: nothing more is sent for it
    std::chrono::steady_clock::time_point deadline;  // the wait on a device destination's, then the copies'
    std::optional<kv_device_destination> peer;       // the device path's, once taken
    bool routes_known = false;                       // the stage pairs' answer is taken
    std::vector<kv_stage_route> routes;              // per remote stage, in order; empty: none
  };
  struct step_entry {
    int64_t request_id = 0;
    stream* state = nullptr;
    const std::vector<int32_t>* block_table = nullptr;
    int32_t token_begin = 0;  // block-aligned
    int32_t token_end = 0;
    bool last_chunk = false;
  };

  void copy_in_place(step_entry& e, std::span<const int32_t> ids, int first_block, int layer);
  bool copy_layer(step_entry& e, std::span<const int32_t> ids, std::span<const int32_t> peer_ids, int layer);
  void complete_device_copies();
  // Takes the decode side's stage routes for `e` (waiting for them); false when the stream broke.
  bool take_stage_routes(step_entry& e);
  // Remote stage `stage`'s layers of `e` go from that stage to its decode peer.
  void push_from_stage(step_entry& e, std::span<const int32_t> ids, size_t stage);
  // The remote stage holding `layer`, or remote_layers_.size() when it is held here.
  size_t remote_stage_of(int layer) const;
  void break_stream(step_entry& e, int layer, const std::string& why);

  const model& model_;
  kv_sender& sender_;
  kv_device_path device_;
  kv_stage_pair_path stage_pairs_;
  std::vector<layer_range> remote_layers_;  // stage_pairs_'s remote stages
  std::chrono::milliseconds timeout_;
  int block_size_;
  std::unordered_map<int64_t, stream> streams_;
  std::vector<step_entry> step_;
};

}  // namespace troupe
