#pragma once
// The prefill side of the KV data plane: frames queued per transfer, sent on the sender's own
// thread as soon as the transfer's destination is known, so the compute thread that exports a
// layer never waits for the network.
//
// A transfer's frames may be queued before its destination is known (the decode instance has
// not reserved its blocks yet): they wait, holding their memory, until ready() names the
// destination or the transfer's deadline passes (open() says how that deadline runs). That
// buffered memory is the prefill side's lease: bounded per sender (max_buffered_bytes), released
// when the frames are handed to the socket, when the transfer is cancelled, or at its deadline
// (then `failed` is called).
//
// The payload buffers are recycled: a frame's buffer goes back to the sender's pool once its
// bytes are on the socket (plain TCP), once ZeroMQ frees the message (after its I/O thread sent
// it), once a receiver of this process copied it, or when its frame is dropped; the exporter
// takes the next frame's buffer with take_buffer() (kv_buffer_pool.hpp says why).
//
// Thread safety: every call may come from any thread; events come on the sender's thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_frame.hpp"

namespace troupe {

struct kv_sender_events {
  std::function<void(uint64_t transfer_id, const std::string& why)> failed;
};

struct kv_sender_stats {
  uint64_t num_frames = 0;  // handed to a socket or a local receiver
  uint64_t num_bytes = 0;
  size_t num_transfers = 0;            // open (leases)
  size_t num_buffered_bytes = 0;       // queued, not yet sent
  size_t num_destinations = 0;         // sockets open (one per destination endpoint)
  uint64_t num_buffers_reused = 0;     // take_buffer() served from a buffer a sent frame gave back
  uint64_t num_buffers_allocated = 0;  // take_buffer() that allocated
  size_t num_pooled_buffers = 0;       // kept for reuse now
  size_t num_pooled_bytes = 0;         // their capacity
};

class kv_sender {
 public:
  kv_sender(kv_channel_settings settings, kv_sender_events events);
  ~kv_sender();  // stops the thread; queued frames are dropped
  kv_sender(const kv_sender&) = delete;
  kv_sender& operator=(const kv_sender&) = delete;

  // A payload buffer of `bytes` for send(), reused from a frame that has left when one of
  // enough capacity is kept (kv_buffer_pool; bounded by settings.max_pooled_bytes), else new.
  // Its contents are unspecified: the caller writes every byte. Every buffer send() takes, from
  // here or not, comes back to the pool once its bytes have left or its frame was dropped.
  std::vector<std::byte> take_buffer(size_t bytes);
  // Opens a transfer whose destination must be known (ready) before `deadline`. Its frames must
  // then be sent within as long again, counted from the ready: the decode side counts its own
  // deadline from the reservation the ready announces, so a reservation that came late (the
  // decode side behind) does not leave the transfer only the rest of its first window.
  void open(uint64_t transfer_id, std::chrono::steady_clock::time_point deadline);
  // Queues one frame (header.payload_bytes == payload.size()) of an open transfer; frames of one
  // transfer are sent in the order queued. Returns false (and drops the frame) for a transfer
  // not open, or when the buffer is full: the transfer then fails.
  bool send(kv_frame_header header, std::vector<std::byte> payload);
  // The destination of a transfer: the receiver's endpoint and CURVE public key (from the
  // decode side's kv_ready). May come before open(); such an early ready is kept (bounded) until
  // open() or a deadline.
  void ready(uint64_t transfer_id, std::string endpoint, std::string server_public_key);
  // Marks the transfer's last frame queued: once sent, the transfer is closed (no event).
  void finish(uint64_t transfer_id);
  // Drops the transfer's queued frames and closes it without an event.
  void cancel(uint64_t transfer_id);
  // The transfer cannot be sent whole: its queued frames are dropped and, in their place, a
  // give-up frame (kv_frame_header::gave_up) saying `why` goes to its destination once known, so
  // the receiver fails it at once. An id not open: nothing.
  void give_up(uint64_t transfer_id, int64_t request_id, const std::string& why);
  // Blocks until nothing is queued (tests and benchmarks), at most `timeout`; false on timeout.
  bool wait_idle(std::chrono::milliseconds timeout);
  kv_sender_stats stats() const;

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
