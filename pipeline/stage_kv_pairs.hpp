#pragma once
// A pipeline stage's half of the KV channel per pair of stages (kvtransfer/kv_stage_pairs.hpp),
// inside `troupe stage` beside the stage server that owns it:
//
//   decode stage   lease(): the engine lends it the blocks of one transfer for this stage's layers;
//                  its KV receiver (kvtransfer/kv_receiver.hpp, made at the first lease) takes the
//                  prefill stage's frames for them under that lease, and once every layer has every
//                  token it tells the engine's receiver with one in-place frame (the relay); a
//                  lease that fails is told to it with a give-up frame, and fails there at once.
//                  release(): the lease ends; nothing more is written into its blocks.
//   prefill stage  push(): exports its layers of a request's blocks and queues them on its KV
//                  sender (made at the first push) to the decode stage's receiver.
//
// Both use the stage's channel settings: plain TCP on loopback without keys, ZeroMQ with CURVE
// with the cluster's keys (only members get in). Thread safety: every call may come from any
// thread (the stage server calls from its serving thread; the receiver's events come on its own).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_receiver.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "kvtransfer/kv_stage_pairs.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"

namespace troupe {

struct stage_kv_pairs_stats {
  uint64_t frames_received = 0;  // imported from a prefill stage
  uint64_t bytes_received = 0;
  uint64_t frames_refused = 0;
  uint64_t frames_pushed = 0;  // handed to a decode stage's socket (or this process's receiver)
  uint64_t bytes_pushed = 0;
  uint64_t relays = 0;  // transfers whose layers were all in, told to their engine
  size_t leases = 0;    // live
};

class stage_kv_pairs {
 public:
  // `stage` (the stage's model, holding `layers`) must outlive this. `channel`: bind host, keys
  // and bounds of the receiver and the sender.
  stage_kv_pairs(model& stage, layer_range layers, kv_channel_settings channel);
  ~stage_kv_pairs();
  stage_kv_pairs(const stage_kv_pairs&) = delete;
  stage_kv_pairs& operator=(const stage_kv_pairs&) = delete;

  // Leases `lease`'s blocks for this stage's layers; returns this stage's receiver. Throws
  // std::invalid_argument naming what is wrong (blocks outside the pool, a transfer leased twice).
  kv_stage_route lease(const kv_stage_lease& lease);
  // Ends a lease; returns once no frame is written into its blocks. Unknown ids: nothing.
  void release(uint64_t transfer_id);
  // Exports `push`'s span (this stage's layers) and queues it to push.to. Throws
  // std::invalid_argument naming what is wrong (layers that are not this stage's, blocks outside
  // the pool); the sender's own failures (a receiver that refuses or never answers) are logged.
  void push(const kv_stage_push& push);

  stage_kv_pairs_stats stats() const;

 private:
  struct relay_target {
    int64_t request_id = 0;
    int32_t num_tokens = 0;
    std::chrono::milliseconds timeout{0};
    std::string endpoint;
    std::string public_key;
  };
  // Tells the engine transfer_id's layers are in (the relay).
  void relay(uint64_t transfer_id);
  // The engine's receiver for transfer_id, taken from relays_ and opened on the sender (nullopt
  // when released meanwhile); `completed` counts a relay.
  std::optional<relay_target> open_to_engine(uint64_t transfer_id, bool completed);
  void open_sender_transfer(uint64_t transfer_id, std::chrono::milliseconds timeout);

  model& stage_;
  layer_range layers_;
  kv_channel_settings channel_;
  mutable std::mutex mutex_;
  std::map<uint64_t, relay_target> relays_;  // a live lease's engine, by transfer id
  uint64_t num_relays_ = 0;
  // Declared last: destroyed first (their threads call back into the members above).
  std::unique_ptr<kv_sender> sender_;
  std::unique_ptr<kv_receiver> receiver_;
};

}  // namespace troupe
