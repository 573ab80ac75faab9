#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/silu_and_mul.cuh"

namespace troupe::cuda {

void silu_and_mul(const void* gate_up, void* out, int rows, int inter, dtype type, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * inter;
  if (total == 0) return;
  dispatch_activation(type, "silu_and_mul", [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 132 * 16));
    silu_and_mul_kernel<T>
        <<<blocks, 256, 0, stream>>>(static_cast<const T*>(gate_up), static_cast<T*>(out), rows, inter);
    check_launch("silu_and_mul_kernel");
  });
}

}  // namespace troupe::cuda
