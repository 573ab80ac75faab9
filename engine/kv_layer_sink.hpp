#pragma once
// Where a prefill worker's KV goes, layer by layer, as its steps compute it: all the engine knows
// of the KV data plane. The model_runner tells the sink which requests stream (start / forget),
// which of a step's entries stream (prepare), each layer as the forward writes it
// (on_layer_written), and when the forward is done (finish_step). What a sink does with a layer
// (export it into a frame for a socket, copy it device to device, hand it to another process) is
// its own business: kvtransfer/kv_layer_streamer.hpp is the serving implementation, over the KV
// plane's sender and its transports.
//
// Contract, as the model_runner keeps it:
// - Ownership: the runner owns its sink (model_runner::stream_kv_to); whatever the sink refers to
//   (the model, the transport) is the caller's, and outlives the runner.
// - Thread: every call comes from the thread that runs the runner's steps, one at a time;
//   on_layer_written comes from inside the forward (model/forward_batch.hpp, after_layer_kv),
//   which runs on that same thread. A sink needs no lock of its own for these calls.
// - Order, per step: forget (the plan's ended and preempted requests), start / forget (the
//   requests the plan starts on the worker), prepare; then, only when prepare returned true,
//   on_layer_written for layers 0 .. num_layers-1 in order, and finish_step once after the
//   forward. A step whose forward throws gets no finish_step; the next step's prepare begins
//   afresh (a sink forgets the step it prepared before).
// - The block tables prepare receives (tables[i]: plan entry i's whole table) stay valid until
//   finish_step returns.

#include <cstdint>
#include <vector>

#include "engine/step_plan.hpp"

namespace troupe {

class kv_layer_sink {
 public:
  virtual ~kv_layer_sink() = default;

  // A plan entry started request `request_id` on the worker with a send transfer
  // (scheduled_sequence::kv_send_transfer_id), or started it again after a preemption (the
  // transfer stays open and is sent again from its first token).
  virtual void start(int64_t request_id, uint64_t transfer_id) = 0;
  // The request ended on the worker (preempted false: its transfer is cancelled unless its last
  // chunk went out) or was preempted (preempted true: start() will come again). A request the
  // sink does not know is ignored.
  virtual void forget(int64_t request_id, bool preempted) = 0;

  // Before a step's forward: picks the entries of `plan` that stream. Returns whether any does;
  // only then does the forward call on_layer_written.
  virtual bool prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) = 0;
  // Layer `layer` of the step's batch is in the model's KV pool.
  virtual void on_layer_written(int layer) = 0;
  // After the forward: every prepared entry's tokens are out; an entry that sampled was its
  // request's last chunk.
  virtual void finish_step() = 0;
};

}  // namespace troupe
