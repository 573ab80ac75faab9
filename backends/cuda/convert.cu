#include "backends/cuda/convert.cuh"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

void convert(const void* in, dtype from, void* out, dtype to, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
  dispatch_activation(to, "convert", [&](auto out_type) {
    using Out = decltype(out_type);
    if (from == dtype::q8_0) {
      if (n % 32 != 0)
        throw std::runtime_error("CUDA convert: a Q8_0 tensor of " + std::to_string(n) +
                                 " values is not a whole number of 32-value blocks");
      dequantize_q8_0_kernel<Out>
          <<<blocks, threads, 0, stream>>>(static_cast<const uint8_t*>(in), static_cast<Out*>(out), n);
      check_launch("dequantize_q8_0_kernel");
      return;
    }
    dispatch_activation(from, "convert", [&](auto in_type) {
      using In = decltype(in_type);
      convert_kernel<In, Out><<<blocks, threads, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), n);
      check_launch("convert_kernel");
    });
  });
}

}  // namespace troupe::cuda
