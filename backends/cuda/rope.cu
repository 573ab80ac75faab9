#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/rope.cuh"

namespace troupe::cuda {

void rope(void* qkv, int64_t row_stride, const int32_t* positions, const float* inv_freq, const void* q_norm,
          const void* k_norm, float eps, int num_tokens, int num_heads, int num_kv_heads, int head_dim, dtype type,
          cudaStream_t stream) {
  if (num_tokens == 0) return;
  if (head_dim % 2 != 0) throw std::runtime_error("CUDA rope: head_dim " + std::to_string(head_dim) + " is odd");
  dispatch_activation(type, "rope", [&](auto tag) {
    using T = decltype(tag);
    const int threads = 32 * std::min(8, num_heads + num_kv_heads);
    rope_kernel<T><<<num_tokens, threads, 0, stream>>>(static_cast<T*>(qkv), row_stride, positions, inv_freq,
                                                       static_cast<const T*>(q_norm), static_cast<const T*>(k_norm),
                                                       eps, num_heads, num_kv_heads, head_dim);
    check_launch("rope_kernel");
  });
}

}  // namespace troupe::cuda
