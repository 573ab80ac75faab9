// Pieces of the CUDA kernels' block decoders (backends/cuda/quant_blocks.cuh) on the host: the
// table lookup, field alignment, and which types have a decoder. The decoders themselves are
// checked block by block in quant_kernels_host_test.cpp and quant_device_branches_test.cpp.

#include <gtest/gtest.h>

#include "backends/cuda/quant_blocks.cuh"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

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
