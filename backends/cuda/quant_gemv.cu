#include "backends/cuda/ops.hpp"
#include "backends/cuda/quant_gemv.cuh"

namespace troupe::cuda {

void quant_gemv(const void* weight, dtype weight_type, const float* row_scales, int rows, int cols, const void* x,
                int64_t ldx, dtype in_type, int tokens, const void* bias, void* y, int64_t ldy, dtype out_type,
                cudaStream_t stream) {
  if (tokens == 0 || rows == 0) return;
  const auto fail = [&](const std::string& what) {
    throw std::runtime_error("CUDA quantized matmul (" + std::string(dtype_name(weight_type)) + " weight [" +
                             std::to_string(rows) + ", " + std::to_string(cols) + "]): " + what);
  };
  const int block_size = quant_blocks::decoder_block_size(weight_type);
  if (block_size == 0) fail("no CUDA kernel decodes this type");
  if (cols <= 0 || cols % block_size != 0)
    fail("rows must be whole blocks of " + std::to_string(block_size) + " values");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || ldx % 8 != 0 || ldx < cols) {
    fail("activations must start 16-byte aligned with rows a multiple of 8 values apart, at least cols wide");
  }
  if (reinterpret_cast<uintptr_t>(weight) % 16 != 0) fail("the weight must start 16-byte aligned");
  if (ldy < rows) fail("output rows must be at least rows wide");
  if (out_type != dtype::f32 && out_type != dtype::f16 && out_type != dtype::bf16) {
    fail("output dtype " + std::string(dtype_name(out_type)) + " is not f32, f16 or bf16");
  }
  quant_gemv_params p;
  p.weight = static_cast<const std::byte*>(weight);
  p.row_bytes = static_cast<int64_t>(row_bytes(weight_type, cols));
  p.rows = rows;
  p.cols = cols;
  p.x = x;
  p.ldx = ldx;
  p.tokens = tokens;
  p.row_scale = row_scales;
  p.bias = bias;
  p.y = y;
  p.ldy = ldy;
  p.out_type = out_type;
  if (quant_gemv_legacy(weight_type, p, in_type, stream) || quant_gemv_k(weight_type, p, in_type, stream) ||
      quant_gemv_nonlinear(weight_type, p, in_type, stream) || quant_gemv_fp8(weight_type, p, in_type, stream)) {
    return;
  }
  fail("no CUDA kernel decodes this type");
}

}  // namespace troupe::cuda
