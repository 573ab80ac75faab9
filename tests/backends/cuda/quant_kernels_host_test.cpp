// The quantized kernels' per-thread code run on the host, branch the host compiles (with its
// alignment checks): each part of each block against the reference dequantizer bit for bit,
// quant_gemv's gemv_partial summed over the 128 threads of each CTA as a CTA would run it (rows
// past the matrix, tokens past the batch, blocks beyond one pass of the CTA), and dequantize_rows'
// items. No GPU needed: what a device run adds is the warp reduction, the launch and the
// intrinsics (quant_device_branches_test.cpp runs the device branches with host stand-ins for
// those; quant_matmul_test.cpp checks everything where a GPU answers).

#include "backends/cuda/dequantize_rows.cuh"
#include "backends/cuda/quant_blocks.cuh"
#include "backends/cuda/quant_gemv.cuh"
#include "tests/backends/cuda/quant_kernel_checks.hpp"

namespace troupe::cuda {
namespace {

TEST(cuda_quant_kernels_on_host, every_part_decodes_to_the_reference_values_and_parts_cover_each_block_once) {
  expect_parts_decode_to_the_reference_values();
}

TEST(cuda_quant_kernels_on_host, gemv_threads_of_each_cta_sum_to_the_reference_product) {
  expect_gemv_ctas_to_sum_to_the_reference_product();
}

TEST(cuda_quant_kernels_on_host, dequantize_items_write_every_element_rounded_once) {
  expect_dequantize_items_to_write_the_reference_values();
}

TEST(cuda_quant_kernels_on_host, every_fp8_code_decodes_exactly) { expect_every_fp8_code_to_decode_exactly(); }

}  // namespace
}  // namespace troupe::cuda
