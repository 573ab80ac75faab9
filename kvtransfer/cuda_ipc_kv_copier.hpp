#pragma once
// CUDA IPC between two processes on one host (kv_transport "cuda_ipc"; compiled where CUDA is).
//
// The decode side describes its KV pool once, as bytes that travel in the transfer setup beside
// the receiver's endpoint: cudaIpcGetMemHandle of the pool's allocation and the pool's geometry
// (cuda_ipc_pool_handle). The prefill side opens each peer's handle once and keeps it
// (cudaIpcOpenMemHandle, cached per peer), then copies each layer's blocks device to device, one
// cudaMemcpyAsync per run of blocks consecutive on both sides (device_kv_runs), and returns once
// they are complete. Only then does it queue an in-place frame (kv_frame_header::in_place) on
// its kv_sender: the ZeroMQ control path tells the receiver's lease that the layer is in, so
// deadlines, cancels and completion work as for the bytes-in-frames transport.
//
// Both pools must have the same block geometry and dtype (no conversion on this path). The pool
// must be its own allocation (cuda_model's is): a handle names an allocation, not an offset in it.
//
// Not thread-safe: one copier per sending thread (the worker's forward thread calls it from
// forward_batch::after_layer_kv).

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "kvtransfer/device_kv_copier.hpp"
#include "model/model.hpp"

namespace troupe {

// A pool advertised in this process is remembered with its address: CUDA refuses to open a
// process's own handle, so a prefill and a decode instance in one process (both placed on one
// node) copy through the address instead.
//
// The bytes that let another process on this host open `pool` (throws std::runtime_error naming
// the CUDA error, e.g. for a pool not in device memory).
std::string cuda_ipc_pool_handle(const device_kv_pool& pool);
// The geometry a handle carries (base is null: the pool is in another process). Throws
// std::invalid_argument naming the field for bytes that are not a handle of this version.
device_kv_pool cuda_ipc_handle_geometry(const std::string& handle);

class cuda_ipc_kv_copier final : public device_kv_copier {
 public:
  // `local` is this process's pool (model::kv_pool_on_device), the source of every copy.
  explicit cuda_ipc_kv_copier(device_kv_pool local);
  ~cuda_ipc_kv_copier() override;  // closes every peer's handle
  cuda_ipc_kv_copier(const cuda_ipc_kv_copier&) = delete;
  cuda_ipc_kv_copier& operator=(const cuda_ipc_kv_copier&) = delete;

  // Copies layers [first_layer, first_layer + num_layers) of local_blocks[i] into
  // peer_blocks[i] of the pool `peer_handle` describes, and returns once the copies are done.
  // Throws std::invalid_argument (device_kv_runs' checks: geometry, ids, layers) before any copy,
  // std::runtime_error naming the CUDA call that failed.
  void copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
               std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
               std::chrono::steady_clock::time_point deadline) override;
  // Closes a peer's handle (its decode instance is gone); unknown handles: nothing.
  void forget(const std::string& peer_handle);
  size_t num_open_peers() const { return peers_.size(); }

 private:
  struct opened_peer {
    device_kv_pool pool;  // base: the mapping in this process
    bool mapped = true;   // false for a pool of this very process: nothing to close
  };
  opened_peer& open(const std::string& peer_handle);

  device_kv_pool local_;
  void* stream_ = nullptr;  // cudaStream_t, kept out of this header
  std::map<std::string, opened_peer> peers_;
};

}  // namespace troupe
