#pragma once
// What the prefill side's KV stream needs from a device transport (kvtransfer/kv_layer_streamer): copy a
// layer's blocks from this process's pool into a peer's, named by the bytes the peer advertised.
// An interface so the engine builds without CUDA (the copier's .cpp compiles only with it) and
// its device path is checked on the CPU with a copier of the test's own.
//
// The decode side advertises its pool with device_kv_pool_handle (cuda_ipc: one handle for
// every peer) or nccl_kv_inbox::handle_for (nccl: one per prefill peer); the prefill side opens
// it through make_device_kv_copier's copier. Both are refused by name where the transport cannot
// run: a build without CUDA (or NCCL), a transport that has no copier (zmq carries bytes).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvtransfer/kv_pair_link.hpp"
#include "kvtransfer/kv_transport.hpp"
#include "model/model.hpp"

namespace troupe {

// The most bytes a pool handle may have on the wire (kv_ready_msg): a CUDA IPC handle is 64
// bytes and its geometry a few more; anything near this bound is not a handle.
inline constexpr size_t max_kv_pool_handle_bytes = 1024;

class device_kv_copier {
 public:
  virtual ~device_kv_copier() = default;
  // Whether the receiver must have a layer's in-place frame before its data. false (CUDA IPC):
  // copy_to returns once the blocks are there, and the frame then says so. true (NCCL): the
  // receiver posts its receive when the frame arrives, so the frame goes first, copy_to only
  // posts the copies, and complete() waits for them. Its frames are sequenced (next_sequence).
  virtual bool frame_first() const { return false; }
  // frame_first: the place in `peer_handle`'s pair order that the next copy_to to it takes, for
  // its in-place frame (kv_frame_header::sequenced): the receiver posts its receives in this
  // order, whatever order the frames arrive in.
  virtual uint64_t next_sequence(const std::string& peer_handle) {
    (void)peer_handle;
    return 0;
  }
  // Copies layers [first_layer, first_layer + num_layers) of local_blocks[i] into peer_blocks[i]
  // of the pool `peer_handle` names (see frame_first for when they are there); no wait outlives
  // `deadline`, the transfer's. Throws naming what is wrong: geometry, ids, a device call.
  virtual void copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
                       std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
                       std::chrono::steady_clock::time_point deadline) = 0;
  // Returns once every copy posted to `peer_handle` is complete, bounded by `deadline`; throws
  // naming why not. Nothing to wait for where copy_to returns complete.
  virtual void complete(const std::string& peer_handle, std::chrono::steady_clock::time_point deadline) {
    (void)peer_handle;
    (void)deadline;
  }
};

// The bytes that name `pool` to the other side of `transport`. Throws std::runtime_error naming
// the transport and why it has no handle here (nccl has one per peer: nccl_kv_inbox).
std::string device_kv_pool_handle(kv_transport transport, const device_kv_pool& pool);
// The copier of `transport` whose source is `local`. Throws std::runtime_error like the above.
std::unique_ptr<device_kv_copier> make_device_kv_copier(kv_transport transport, const device_kv_pool& local);
// nccl's decode side: the pair links of `local` (nccl_kv_inbox joins with them). Throws
// std::runtime_error like the above where this build has no NCCL.
std::shared_ptr<kv_pair_links> make_device_kv_pair_links(kv_transport transport, const device_kv_pool& local);

}  // namespace troupe
