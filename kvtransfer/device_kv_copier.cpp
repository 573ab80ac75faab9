#include "kvtransfer/device_kv_copier.hpp"

#include <stdexcept>

#include "kvtransfer/nccl_kv_copier.hpp"

#if TROUPE_KV_CUDA
#include "kvtransfer/cuda_ipc_kv_copier.hpp"
#endif
#if TROUPE_KV_NCCL
#include "kvtransfer/nccl_kv_channel.hpp"
#endif

namespace troupe {

namespace {

// Why `transport` has no copier in this build ("" when it has one).
std::string without_copier(kv_transport transport) {
  const std::string named = "kv_transport \"" + std::string(kv_transport_name(transport)) + "\"";
  if (transport == kv_transport::zmq) return named + " carries the bytes in its frames: it has no device copier";
#if !TROUPE_KV_CUDA
  return named + " needs CUDA, and this build has none";
#elif !TROUPE_KV_NCCL
  if (transport == kv_transport::nccl) return named + " needs NCCL, and this build has none";
  return {};
#else
  return {};
#endif
}

}  // namespace

std::string device_kv_pool_handle(kv_transport transport, const device_kv_pool& pool) {
  if (const std::string why = without_copier(transport); !why.empty()) throw std::runtime_error(why);
  if (transport == kv_transport::nccl) {
    throw std::runtime_error(
        "kv_transport \"nccl\" names a pool per prefill peer (nccl_kv_inbox::handle_for), not once");
  }
#if TROUPE_KV_CUDA
  return cuda_ipc_pool_handle(pool);
#else
  (void)pool;
  return {};
#endif
}

std::shared_ptr<kv_pair_links> make_device_kv_pair_links(kv_transport transport, const device_kv_pool& local) {
  if (const std::string why = without_copier(transport); !why.empty()) throw std::runtime_error(why);
  if (transport != kv_transport::nccl) {
    throw std::runtime_error("kv_transport \"" + std::string(kv_transport_name(transport)) + "\" has no pair links");
  }
#if TROUPE_KV_NCCL
  return make_nccl_pair_links(local);
#else
  (void)local;
  return nullptr;
#endif
}

std::unique_ptr<device_kv_copier> make_device_kv_copier(kv_transport transport, const device_kv_pool& local) {
  if (const std::string why = without_copier(transport); !why.empty()) throw std::runtime_error(why);
  if (transport == kv_transport::nccl)
    return std::make_unique<nccl_kv_copier>(local, make_device_kv_pair_links(transport, local));
#if TROUPE_KV_CUDA
  return std::make_unique<cuda_ipc_kv_copier>(local);
#else
  (void)local;
  return nullptr;
#endif
}

}  // namespace troupe
