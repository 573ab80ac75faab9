#pragma once
// The decode side of the KV data plane: a socket bound on its own thread (over plain TCP, with a
// reader thread per sender's connection, so a slow sender delays no other) that takes frames for
// the transfers it was told to expect, checks each against its expectation before it reads the
// payload, and imports it into the reserved blocks of the model's pool.
//
// An expectation is a lease (kvtransfer/kv_lease_table.hpp, which judges every frame): the blocks
// are the scheduler's, lent to the receiver until the transfer completes, fails, is cancelled, or
// its deadline passes; exactly one of `complete` or `failed` is called for every expectation not
// cancelled, and the expectation is then gone.
// Frames for a transfer the receiver does not expect (unknown, finished, cancelled, timed out),
// or that do not fit the expectation (request id, layer range, token range not contiguous with
// what arrived, geometry, payload size), are refused unread and counted; a bad frame for an
// expected transfer fails that transfer (its sender is broken), a frame for an unknown transfer
// is only counted (a late frame of a cancelled transfer is normal).
//
// Thread safety: expect/cancel/stats may be called from any thread; the events are called on the
// receiver's threads (or, for frames from a sender in the same process, on the sender's thread),
// possibly several at once: the events must be thread-safe.
// model::import_kv runs on those threads, concurrently with the model's forward on other blocks.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_frame.hpp"
#include "kvtransfer/kv_lease_table.hpp"
#include "kvtransfer/nccl_kv_inbox.hpp"
#include "model/model.hpp"

namespace troupe {

struct kv_receiver_events {
  std::function<void(uint64_t transfer_id, int64_t request_id)> complete;
  std::function<void(uint64_t transfer_id, int64_t request_id, const std::string& why)> failed;
};

struct kv_receiver_stats {
  uint64_t num_frames = 0;         // imported
  uint64_t num_bytes = 0;          // imported payload bytes
  uint64_t num_refused = 0;        // refused frames
  std::string last_refusal;        // why the latest was refused
  uint64_t num_refused_peers = 0;  // connections refused at the CURVE handshake (no or unknown keys)
  size_t num_expected = 0;         // live expectations (leases)
};

class kv_receiver {
 public:
  // Binds settings.bind_host:0 and starts the thread. `m` must outlive the receiver. `inbox`:
  // where expectations with a device_pair receive (kv_transport "nccl"); closed with the receiver.
  kv_receiver(model& m, kv_channel_settings settings, kv_receiver_events events,
              std::shared_ptr<nccl_kv_inbox> inbox = nullptr);
  ~kv_receiver();  // stops the thread; live expectations are dropped without events
  kv_receiver(const kv_receiver&) = delete;
  kv_receiver& operator=(const kv_receiver&) = delete;

  // What senders connect to ("tcp://HOST:PORT"); also the key of this receiver in the process's
  // registry, through which a sender in the same process delivers directly.
  const std::string& endpoint() const;
  // The CURVE public key senders must use as the server key ("" without keys).
  const std::string& public_key() const;

  // Throws std::invalid_argument naming the field for a transfer id already expected, fewer
  // blocks than num_tokens needs, a block id outside the pool, or a device_pair without an inbox.
  void expect(kv_expectation expectation);
  // Drops the expectation without an event (the request ended or moved). Unknown ids: nothing.
  // Returns only when no frame is being written into its blocks (an nccl receive in flight is
  // stopped and its pair broken first).
  void cancel(uint64_t transfer_id);
  // Fails a live expectation for `why` (its `failed` event fires, on the calling thread): the KV
  // it waited for can no longer come (a pipeline stage that held part of it was lost). Unknown
  // ids: nothing.
  void fail(uint64_t transfer_id, const std::string& why);
  kv_receiver_stats stats() const;

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
