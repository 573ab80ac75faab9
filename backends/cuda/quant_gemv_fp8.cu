// The quantized GEMV for FP8 E4M3 weights (row scales in the epilogue; block-scaled b128).
#include "backends/cuda/quant_gemv.cuh"

namespace troupe::cuda {

bool quant_gemv_fp8(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream) {
  using namespace quant_blocks;
  switch (weight_type) {
    case dtype::fp8_e4m3: launch_quant_gemv<fp8_e4m3_block>(p, in_type, stream); return true;
    case dtype::fp8_e4m3_b128: launch_quant_gemv<fp8_e4m3_b128_block>(p, in_type, stream); return true;
    default: return false;
  }
}

}  // namespace troupe::cuda
