#include "kvtransfer/cuda_ipc_kv_copier.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "kvtransfer/device_kv_runs.hpp"
#include "model/kv_transfer.hpp"

namespace troupe {

namespace {

constexpr uint32_t handle_magic = 0x50495654;  // "TVIP"
constexpr uint32_t handle_version = 1;

// The handle's bytes: fixed fields in this host's byte order (both processes share the host).
struct handle_fields {
  uint32_t magic = handle_magic;
  uint32_t version = handle_version;
  cudaIpcMemHandle_t memory{};
  int32_t device = 0;
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t element = 0;
  uint64_t block_bytes = 0;
};

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("cuda ipc: ") + what + ": " + cudaGetErrorString(status));
  }
}

// The pools this process advertised, by handle: their addresses here (see the header).
std::mutex advertised_mutex;
std::map<std::string, void*>& advertised() {
  static std::map<std::string, void*> pools;
  return pools;
}

void* advertised_here(const std::string& handle) {
  std::lock_guard lock(advertised_mutex);
  auto it = advertised().find(handle);
  return it == advertised().end() ? nullptr : it->second;
}

handle_fields read_handle(const std::string& handle) {
  handle_fields fields;
  if (handle.size() != sizeof fields) {
    throw std::invalid_argument("cuda ipc handle: " + std::to_string(handle.size()) + " bytes, expected " +
                                std::to_string(sizeof fields));
  }
  std::memcpy(&fields, handle.data(), sizeof fields);
  if (fields.magic != handle_magic) throw std::invalid_argument("cuda ipc handle: bad magic");
  if (fields.version != handle_version) {
    throw std::invalid_argument("cuda ipc handle: version " + std::to_string(fields.version) + ", this build reads " +
                                std::to_string(handle_version));
  }
  if (fields.num_layers <= 0 || fields.num_blocks <= 0 || fields.block_bytes == 0) {
    throw std::invalid_argument("cuda ipc handle: num_layers, num_blocks and block_bytes must be positive");
  }
  const auto element = static_cast<dtype>(fields.element);
  if (!is_kv_element(element)) {
    throw std::invalid_argument("cuda ipc handle: element type " + std::to_string(fields.element) +
                                " is not a KV cache type (f32, f16, bf16, q8_0, fp8_e4m3)");
  }
  return fields;
}

}  // namespace

std::string cuda_ipc_pool_handle(const device_kv_pool& pool) {
  handle_fields fields;
  check(cudaSetDevice(pool.device), "cudaSetDevice");
  check(cudaIpcGetMemHandle(&fields.memory, pool.base), "cudaIpcGetMemHandle of the KV pool");
  fields.device = pool.device;
  fields.num_layers = pool.num_layers;
  fields.num_blocks = pool.num_blocks;
  fields.element = static_cast<int32_t>(pool.element);
  fields.block_bytes = pool.block_bytes;
  std::string handle(reinterpret_cast<const char*>(&fields), sizeof fields);
  std::lock_guard lock(advertised_mutex);
  advertised()[handle] = pool.base;
  return handle;
}

device_kv_pool cuda_ipc_handle_geometry(const std::string& handle) {
  const handle_fields fields = read_handle(handle);
  return device_kv_pool{fields.device,      nullptr,
                        fields.num_layers,  fields.num_blocks,
                        fields.block_bytes, static_cast<dtype>(fields.element)};
}

cuda_ipc_kv_copier::cuda_ipc_kv_copier(device_kv_pool local) : local_(local) {
  check(cudaSetDevice(local_.device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
}

cuda_ipc_kv_copier::~cuda_ipc_kv_copier() {
  cudaSetDevice(local_.device);
  for (auto& [handle, peer] : peers_) {
    if (peer.mapped) cudaIpcCloseMemHandle(peer.pool.base);
  }
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

cuda_ipc_kv_copier::opened_peer& cuda_ipc_kv_copier::open(const std::string& peer_handle) {
  if (auto it = peers_.find(peer_handle); it != peers_.end()) return it->second;
  const handle_fields fields = read_handle(peer_handle);
  // Opened on this process's device: the mapping is reachable from it (peer access, enabled
  // lazily, when the peer's pool is on another GPU of the host).
  check(cudaSetDevice(local_.device), "cudaSetDevice");
  const device_kv_pool geometry{fields.device,      nullptr,
                                fields.num_layers,  fields.num_blocks,
                                fields.block_bytes, static_cast<dtype>(fields.element)};
  if (void* here = advertised_here(peer_handle)) {
    opened_peer peer{geometry, false};
    peer.pool.base = here;
    return peers_.emplace(peer_handle, peer).first->second;
  }
  void* base = nullptr;
  check(cudaIpcOpenMemHandle(&base, fields.memory, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle of a peer's KV pool (another process on this host?)");
  opened_peer peer{geometry, true};
  peer.pool.base = base;
  return peers_.emplace(peer_handle, peer).first->second;
}

void cuda_ipc_kv_copier::copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
                                 std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
                                 std::chrono::steady_clock::time_point /*deadline: its copies are local and short*/) {
  // Checked against the handle's geometry before the handle is opened or a byte moves.
  const std::vector<device_kv_run> runs =
      device_kv_runs(local_, local_blocks, cuda_ipc_handle_geometry(peer_handle), peer_blocks, first_layer, num_layers);
  opened_peer& peer = open(peer_handle);
  check(cudaSetDevice(local_.device), "cudaSetDevice");
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto* source = static_cast<const char*>(local_.base);
  auto* target = static_cast<char*>(peer.pool.base);
  for (const device_kv_run& run : runs) {
    check(
        cudaMemcpyAsync(target + run.dst_offset, source + run.src_offset, run.bytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync into a peer's KV pool");
  }
  // Complete before the caller's in-place frame tells the receiver the blocks are there.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the KV copies");
}

void cuda_ipc_kv_copier::forget(const std::string& peer_handle) {
  auto it = peers_.find(peer_handle);
  if (it == peers_.end()) return;
  cudaSetDevice(local_.device);
  if (it->second.mapped) cudaIpcCloseMemHandle(it->second.pool.base);
  peers_.erase(it);
}

}  // namespace troupe
