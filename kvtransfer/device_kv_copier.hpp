#pragma once
// What the prefill side's KV stream needs from a device transport (engine/kv_stream_out): copy a
// layer's blocks from this process's pool into a peer's, named by the bytes the peer advertised.
// An interface so the engine builds without CUDA (the copier's .cpp compiles only with it) and
// its device path is checked on the CPU with a copier of the test's own.
//
// The decode side advertises its pool with device_kv_pool_handle; the prefill side opens it
// through make_device_kv_copier's copier. Both are refused by name where the transport cannot
// run: a build without CUDA, a transport that has no copier here (zmq carries bytes, NCCL is not
// driven by the engine yet).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvtransfer/kv_transport.hpp"
#include "model/model.hpp"

namespace troupe {

// The most bytes a pool handle may have on the wire (kv_ready_msg): a CUDA IPC handle is 64
// bytes and its geometry a few more; anything near this bound is not a handle.
inline constexpr size_t max_kv_pool_handle_bytes = 1024;

class device_kv_copier {
 public:
  virtual ~device_kv_copier() = default;
  // Copies layers [first_layer, first_layer + num_layers) of local_blocks[i] into peer_blocks[i]
  // of the pool `peer_handle` names, and returns once they are there (the caller's in-place
  // frame then tells the receiver so). Throws naming what is wrong: geometry, ids, a device call.
  virtual void copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
                       std::span<const int32_t> peer_blocks, int first_layer, int num_layers) = 0;
};

// The bytes that name `pool` to the other side of `transport`. Throws std::runtime_error naming
// the transport and why it has no handle here.
std::string device_kv_pool_handle(kv_transport transport, const device_kv_pool& pool);
// The copier of `transport` whose source is `local`. Throws std::runtime_error like the above.
std::unique_ptr<device_kv_copier> make_device_kv_copier(kv_transport transport, const device_kv_pool& local);

}  // namespace troupe
