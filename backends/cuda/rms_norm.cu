#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/rms_norm.cuh"

namespace troupe::cuda {

void rms_norm(const void* x, void* residual, const void* weight, void* out, int rows, int cols, float eps, dtype type,
              cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_activation(type, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const int threads = std::min(1024, std::max(32, ((cols / 4 + 31) / 32) * 32));
    rms_norm_kernel<T><<<rows, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(residual),
                                                     static_cast<const T*>(weight), static_cast<T*>(out), cols, eps);
    check_launch("rms_norm_kernel");
  });
}

}  // namespace troupe::cuda
