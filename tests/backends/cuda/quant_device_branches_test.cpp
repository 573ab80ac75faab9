// The quantized kernels' device branches (what nvcc compiles for the GPU: 2^23-mantissa byte
// conversions, byte-permute table lookups, 8- and 16-byte loads, half2 and bfloat162 packing)
// compiled and run on the host with stand-ins for the device-only intrinsics
// (device_intrinsics.hpp), through the same checks as the host branches: a wrong selector,
// magic constant or load order fails here, without waiting for a GPU.

#define TROUPE_EMULATE_DEVICE 1
#include "tests/backends/cuda/device_intrinsics.hpp"

#include "backends/cuda/dequantize_rows.cuh"
#include "backends/cuda/quant_blocks.cuh"
#include "backends/cuda/quant_gemv.cuh"
#include "tests/backends/cuda/quant_kernel_checks.hpp"

namespace troupe::cuda {
namespace {

TEST(cuda_quant_kernels_device_branches, every_part_decodes_to_the_reference_values) {
  static_assert(TROUPE_DEVICE_BRANCH == 1, "this file compiles the device branches");
  expect_parts_decode_to_the_reference_values();
}

TEST(cuda_quant_kernels_device_branches, gemv_threads_of_each_cta_sum_to_the_reference_product) {
  expect_gemv_ctas_to_sum_to_the_reference_product();
}

TEST(cuda_quant_kernels_device_branches, dequantize_items_write_every_element_rounded_once) {
  expect_dequantize_items_to_write_the_reference_values();
}

TEST(cuda_quant_kernels_device_branches, every_fp8_code_decodes_exactly) { expect_every_fp8_code_to_decode_exactly(); }

}  // namespace
}  // namespace troupe::cuda
