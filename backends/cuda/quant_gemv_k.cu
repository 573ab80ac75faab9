// The quantized GEMV for the k-quants (super-blocks of 256).
#include "backends/cuda/quant_gemv.cuh"

namespace troupe::cuda {

bool quant_gemv_k(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream) {
  using namespace quant_blocks;
  switch (weight_type) {
    case dtype::q2_k: launch_quant_gemv<q2_k_block>(p, in_type, stream); return true;
    case dtype::q3_k: launch_quant_gemv<q3_k_block>(p, in_type, stream); return true;
    case dtype::q4_k: launch_quant_gemv<q4_k_block>(p, in_type, stream); return true;
    case dtype::q5_k: launch_quant_gemv<q5_k_block>(p, in_type, stream); return true;
    case dtype::q6_k: launch_quant_gemv<q6_k_block>(p, in_type, stream); return true;
    default: return false;
  }
}

}  // namespace troupe::cuda
