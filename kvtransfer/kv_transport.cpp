#include "kvtransfer/kv_transport.hpp"

#include <stdexcept>

#if TROUPE_KV_CUDA
#include <cuda_runtime.h>
#endif

namespace troupe {

kv_transport parse_kv_transport(std::string_view name) {
  if (name == "zmq") return kv_transport::zmq;
  if (name == "cuda_ipc") return kv_transport::cuda_ipc;
  if (name == "nccl") return kv_transport::nccl;
  throw std::invalid_argument("kv_transport \"" + std::string(name) +
                              "\" is not one of \"zmq\", \"cuda_ipc\", \"nccl\"");
}

std::string_view kv_transport_name(kv_transport transport) {
  switch (transport) {
    case kv_transport::cuda_ipc: return "cuda_ipc";
    case kv_transport::nccl: return "nccl";
    default: return "zmq";
  }
}

std::string kv_transport_unavailable(kv_transport transport) {
  if (transport == kv_transport::zmq) return {};
#if !TROUPE_KV_CUDA
  return "this build has no CUDA (nvcc was not found when it was configured)";
#else
#if !TROUPE_KV_NCCL
  if (transport == kv_transport::nccl) return "this build has no NCCL (libnccl and nccl.h were not found with CUDA)";
#endif
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for later calls
    return std::string("no GPU answers: ") + cudaGetErrorString(status);
  }
  if (count == 0) return "no GPU answers: the CUDA runtime found none";
  return {};
#endif
}

}  // namespace troupe
