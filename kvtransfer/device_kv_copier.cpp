#include "kvtransfer/device_kv_copier.hpp"

#include <stdexcept>

#if TROUPE_KV_CUDA
#include "kvtransfer/cuda_ipc_kv_copier.hpp"
#endif

namespace troupe {

namespace {

// Why `transport` has no copier in this build ("" when it has one).
std::string without_copier(kv_transport transport) {
  const std::string named = "kv_transport \"" + std::string(kv_transport_name(transport)) + "\"";
  if (transport == kv_transport::zmq) return named + " carries the bytes in its frames: it has no device copier";
  if (transport == kv_transport::nccl) return named + " is not driven by the engine yet";
#if !TROUPE_KV_CUDA
  return named + " needs CUDA, and this build has none";
#else
  return {};
#endif
}

}  // namespace

std::string device_kv_pool_handle(kv_transport transport, const device_kv_pool& pool) {
  if (const std::string why = without_copier(transport); !why.empty()) throw std::runtime_error(why);
#if TROUPE_KV_CUDA
  return cuda_ipc_pool_handle(pool);
#else
  (void)pool;
  return {};
#endif
}

std::unique_ptr<device_kv_copier> make_device_kv_copier(kv_transport transport, const device_kv_pool& local) {
  if (const std::string why = without_copier(transport); !why.empty()) throw std::runtime_error(why);
#if TROUPE_KV_CUDA
  return std::make_unique<cuda_ipc_kv_copier>(local);
#else
  (void)local;
  return nullptr;
#endif
}

}  // namespace troupe
