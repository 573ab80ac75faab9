// The quantized GEMV for the table types (IQ4_NL, IQ4_XS, MXFP4).
#include "backends/cuda/quant_gemv.cuh"

namespace troupe::cuda {

bool quant_gemv_nonlinear(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream) {
  using namespace quant_blocks;
  switch (weight_type) {
    case dtype::iq4_nl: launch_quant_gemv<iq4_nl_block>(p, in_type, stream); return true;
    case dtype::iq4_xs: launch_quant_gemv<iq4_xs_block>(p, in_type, stream); return true;
    case dtype::mxfp4: launch_quant_gemv<mxfp4_block>(p, in_type, stream); return true;
    default: return false;
  }
}

}  // namespace troupe::cuda
