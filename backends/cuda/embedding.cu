#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/embedding.cuh"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

void embedding(const void* table, const int32_t* ids, void* out, int n, int cols, dtype type, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_activation(type, "embedding", [&](auto tag) {
    using T = decltype(tag);
    const int threads = std::min(256, ((cols + 31) / 32) * 32);
    embedding_kernel<T><<<n, threads, 0, stream>>>(static_cast<const T*>(table), ids, static_cast<T*>(out), cols);
    check_launch("embedding_kernel");
  });
}

}  // namespace troupe::cuda
