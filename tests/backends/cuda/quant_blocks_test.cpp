// The CUDA kernels' block decoders (backends/cuda/quant_blocks.cuh), run on the host: they are
// written for both compilers, so this machine checks, with no GPU, that each part of each block
// decodes bit for bit to the reference dequantizer's values, that the parts of a block cover its
// elements exactly once, and that every load keeps the alignment it promises.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cuda/quant_blocks.cuh"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

TEST(cuda_quant_blocks, every_part_decodes_to_the_reference_values_and_parts_cover_each_block_once) {
  for (dtype type : quantized_weight_types()) {
    const bool known = quant_blocks::visit(type, [&](auto decoder) {
      using block = decltype(decoder);
      EXPECT_EQ(block::type, type);
      EXPECT_EQ(block::size, dtype_traits_of(type).block_size) << dtype_name(type);
      EXPECT_EQ(static_cast<size_t>(block::bytes), dtype_traits_of(type).block_bytes) << dtype_name(type);
      EXPECT_EQ(block::parts * block::runs * 8, block::size) << dtype_name(type);
      EXPECT_EQ(32 % block::parts, 0) << dtype_name(type) << ": a warp shares whole blocks";
      // Three rows of five blocks, laid out as on the device (rows back to back from an aligned start).
      const int64_t rows = 3, cols = 5 * block::size;
      const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 11 + static_cast<int>(type));
      aligned_bytes device_like(bytes.size());
      std::memcpy(device_like.get(), bytes.data(), bytes.size());
      const std::vector<float> reference = reference_values(type, bytes, rows * cols);
      std::vector<int> seen(reference.size(), 0);
      for (int64_t b = 0; b < rows * cols / block::size; ++b) {
        for (int part = 0; part < block::parts; ++part) {
          float out[block::runs * 8];
          quant_blocks::decode_values<block>(device_like.get() + b * block::bytes, part, out);
          for (int run = 0; run < block::runs; ++run) {
            const int start = block::run_start(part, run);
            ASSERT_EQ(start % 8, 0) << dtype_name(type) << ": a run starts on a multiple of 8";
            for (int j = 0; j < 8; ++j) {
              const size_t element = static_cast<size_t>(b * block::size + start + j);
              ASSERT_LT(element, reference.size());
              ++seen[element];
              uint32_t got, want;
              std::memcpy(&got, &out[run * 8 + j], 4);
              std::memcpy(&want, &reference[element], 4);
              ASSERT_EQ(got, want) << dtype_name(type) << " block " << b << " part " << part << " run " << run
                                   << " element " << element % block::size << ": " << out[run * 8 + j]
                                   << ", reference " << reference[element];
            }
          }
        }
      }
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << dtype_name(type) << " element " << i;
    });
    EXPECT_TRUE(known) << dtype_name(type);
  }
  EXPECT_FALSE(quant_blocks::visit(dtype::bf16, [](auto) {}));
  EXPECT_FALSE(quant_blocks::visit(dtype::fp8_e4m3, [](auto) {}));
}

// The table lookups that IQ4 and MXFP4 decode through, index by index.
TEST(cuda_quant_blocks, table_lookup_returns_each_level) {
  const int iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (uint32_t a = 0; a < 16; ++a) {
    const uint32_t indices = a | ((15 - a) << 8) | (((a + 5) % 16) << 16) | (((a * 7) % 16) << 24);
    const uint32_t levels = quant_blocks::lookup4<quant_blocks::iq4_levels>(indices);
    for (int n = 0; n < 4; ++n) {
      const int index = static_cast<int>((indices >> (8 * n)) & 0xff);
      EXPECT_EQ(static_cast<int8_t>((levels >> (8 * n)) & 0xff), iq4[index]) << "index " << index;
    }
  }
}

TEST(cuda_quant_blocks, field_alignment_is_the_largest_power_of_two_every_address_keeps) {
  using quant_blocks::field_align;
  EXPECT_EQ(field_align(16, 16, 8), 8);
  EXPECT_EQ(field_align(16, 0), 16);
  EXPECT_EQ(field_align(2, 2, 8), 2);
  EXPECT_EQ(field_align(4, 80), 4);
  EXPECT_EQ(field_align(8, 4), 4);
  EXPECT_EQ(field_align(1, 1, 8), 1);
  EXPECT_EQ(field_align(16, 48, 32), 16);
}

}  // namespace
}  // namespace troupe::cuda
