#pragma once
// The decode side's leases: which KV transfers a receiver expects, into which of its pool's
// blocks, how many tokens of each layer have arrived, and what becomes of each. A lease is made
// by expect() and ends exactly once: complete (every layer has every token), failed (a frame
// that does not fit it, a frame its receiver could not take, or its deadline passed), or
// cancelled (its owner no longer wants it; no outcome). Frames are judged here by their header
// alone, before a byte of their payload is read: a frame for a transfer with no lease (unknown,
// finished, cancelled, timed out: a late frame of a cancelled transfer is normal) is refused
// without failing anything; a frame that does not fit its lease fails that lease, whose sender is
// broken.
//
// A plain class with no sockets, threads or clock: the receiver (kvtransfer/kv_receiver.cpp)
// holds it under its lock, takes the payloads and gives it the time; outcomes are returned to
// it, never called back, so the receiver fires its events once its lock is released.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/kv_frame.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"

namespace troupe {

struct kv_expectation {
  uint64_t transfer_id = 0;
  int64_t request_id = 0;
  std::vector<int32_t> block_ids;  // the receiving pool's blocks for tokens [0, num_tokens)
  int32_t num_tokens = 0;          // every layer must receive tokens [0, num_tokens)
  std::chrono::steady_clock::time_point deadline;
  // The KV comes over a device transport (CUDA IPC, NCCL) straight into block_ids; its frames
  // are in place (no payload, only the lease's bookkeeping). Frames with bytes are then refused,
  // and without it frames in place are: a sender cannot claim tokens it never sent.
  bool in_place = false;
  // kv_transport "nccl" (with in_place): the inbox pair (nccl_kv_inbox::handle::pair_id) the
  // blocks come through. An in-place frame then queues that layer's receive on the pair, and
  // counts only once the receive has completed; a failed receive fails the transfer, and a
  // transfer that ends other than complete breaks its pair (nccl_kv_inbox::end).
  std::string device_pair;
  // The layers the lease covers: all of the model's (the default, end 0), or a pipeline stage's
  // own when the stage receives its layers' KV itself (pipeline/stage_kv_pairs.hpp). Frames for
  // other layers are refused; the lease completes once these layers have every token.
  layer_range layers;
  // Layers whose KV goes straight from the prefill's pipeline stage to the decode's matching one
  // (kvtransfer/kv_stage_pairs.hpp), on a decode engine's lease: the stage that received them says
  // so with one in-place frame, and frames with bytes for them are refused. Empty: none.
  layer_range relayed;
};

// How a lease ended (cancelled ones end with none).
struct kv_lease_outcome {
  bool completed = false;
  uint64_t transfer_id = 0;
  int64_t request_id = 0;
  std::string why;          // a failure's, naming the transfer
  std::string device_pair;  // a failed nccl lease's pair, which its owner must end
};

struct kv_lease {
  kv_expectation expectation;
  std::vector<int32_t> num_received;  // [num_layers] tokens [0, n) of each layer have arrived
  // [num_layers] tokens [0, n) of each layer were accepted: arrived, or (nccl) their receive is
  // queued; frames are checked for gaps against this.
  std::vector<int32_t> num_accepted;
};

// What to do with a frame.
struct kv_frame_verdict {
  kv_lease* lease = nullptr;  // the frame fits this lease: take its payload, then book() it
  std::string refusal;        // otherwise why the frame is refused, naming the transfer
  // The lease the refused frame failed (it is gone), when the frame named a live one.
  std::optional<kv_lease_outcome> failed;
};

class kv_lease_table {
 public:
  // `config` and `pool` are the receiving model's (layers, KV geometry, blocks). device_pairs:
  // whether expectations may name a device_pair (the receiver has an nccl inbox).
  kv_lease_table(const model_config& config, kv_cache_shape pool, bool device_pairs);

  // Makes a lease. Throws std::invalid_argument naming the field for a transfer id already
  // leased, a num_tokens that is not positive, fewer blocks than num_tokens needs, a block id
  // outside the pool or named twice, or a device_pair without in_place or without an inbox.
  void expect(kv_expectation expectation);
  // Ends a lease without an outcome; returns its device_pair ("" for none), or nothing when no
  // lease has the id.
  std::optional<std::string> cancel(uint64_t transfer_id);

  // Judges a frame by its header; `payload_size` is the payload's (or, before it is read, the
  // header's announced payload_bytes). A frame that does not fit its lease fails it here.
  kv_frame_verdict admit(const kv_frame_header& h, size_t payload_size);
  // The lease's blocks a frame admitted for it covers, in order.
  std::span<const int32_t> blocks_of(const kv_lease& lease, const kv_frame_header& h) const;
  // An admitted frame's tokens were accepted without being in yet (an nccl receive is queued):
  // later frames are checked for gaps against them.
  void accept(kv_lease& lease, const kv_frame_header& h);
  // An admitted frame's tokens are in the blocks: counted in; the completed outcome once every
  // layer has every token (the lease is then gone). Nothing when no lease has the frame's id.
  std::optional<kv_lease_outcome> book(const kv_frame_header& h);
  // The lease of `transfer_id` fails for `why` (its frame could not be taken): the refusal and the
  // outcome, the lease gone. Nothing failed when no lease has the id.
  kv_frame_verdict fail(uint64_t transfer_id, const std::string& why);
  // Fails every lease whose deadline is at or before `now`, naming the layer furthest behind.
  std::vector<kv_lease_outcome> expire(std::chrono::steady_clock::time_point now);

  size_t size() const { return leases_.size(); }
  const kv_lease* find(uint64_t transfer_id) const;

 private:
  // Why frame `h` does not fit `lease` ("" when it does); nothing of the payload is read.
  std::string mismatch(const kv_lease& lease, const kv_frame_header& h, size_t payload_size) const;

  const int num_layers_;
  const int num_kv_heads_;
  const int head_dim_;
  const kv_cache_shape pool_;
  const bool device_pairs_;
  std::map<uint64_t, kv_lease> leases_;  // a map: a lease stays where it is while others come and go
};

// "KV transfer T (request R)": how refusals and failures name a transfer.
std::string kv_transfer_name(uint64_t transfer_id, int64_t request_id);

}  // namespace troupe
