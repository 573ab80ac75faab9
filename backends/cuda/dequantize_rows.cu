#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/dequantize_rows.cuh"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

void dequantize_rows(const void* table, dtype table_type, const float* row_scales, int cols, const int32_t* ids,
                     int64_t first_row, int n, void* out, int64_t ldo, dtype out_type, cudaStream_t stream) {
  if (n == 0) return;
  const auto fail = [&](const std::string& what) {
    throw std::runtime_error("CUDA dequantize_rows (" + std::string(dtype_name(table_type)) + " rows of " +
                             std::to_string(cols) + "): " + what);
  };
  const int block_size = quant_blocks::decoder_block_size(table_type);
  if (block_size == 0) fail("no CUDA kernel decodes this type");
  if (cols <= 0 || cols % block_size != 0)
    fail("rows must be whole blocks of " + std::to_string(block_size) + " values");
  if (reinterpret_cast<uintptr_t>(table) % 16 != 0) fail("the table must start 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0 || ldo % 8 != 0 || ldo < cols) {
    fail("the output must start 16-byte aligned with rows a multiple of 8 values apart, at least cols wide");
  }
  const int64_t table_row_bytes = static_cast<int64_t>(row_bytes(table_type, cols));
  const bool known = quant_blocks::visit(table_type, [&](auto decoder) {
    using Block = decltype(decoder);
    dispatch_activation(out_type, "dequantize_rows", [&](auto tag) {
      using Out = decltype(tag);
      const int items = cols / Block::size * Block::parts;
      const int threads = std::min(256, (items + 31) / 32 * 32);
      dequantize_rows_kernel<Block, Out><<<n, threads, 0, stream>>>(static_cast<const std::byte*>(table), row_scales,
                                                                    table_row_bytes, cols, ids, first_row,
                                                                    static_cast<Out*>(out), ldo);
      check_launch("dequantize_rows_kernel");
    });
  });
  if (!known) fail("no CUDA kernel decodes this type");
}

}  // namespace troupe::cuda
