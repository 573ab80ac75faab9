// The quantized GEMV for the legacy block types (blocks of 32 with one f16 scale).
#include "backends/cuda/quant_gemv.cuh"

namespace troupe::cuda {

bool quant_gemv_legacy(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream) {
  using namespace quant_blocks;
  switch (weight_type) {
    case dtype::q4_0: launch_quant_gemv<q4_0_block>(p, in_type, stream); return true;
    case dtype::q4_1: launch_quant_gemv<q4_1_block>(p, in_type, stream); return true;
    case dtype::q5_0: launch_quant_gemv<q5_0_block>(p, in_type, stream); return true;
    case dtype::q5_1: launch_quant_gemv<q5_1_block>(p, in_type, stream); return true;
    case dtype::q8_0: launch_quant_gemv<q8_0_block>(p, in_type, stream); return true;
    default: return false;
  }
}

}  // namespace troupe::cuda
