// The GGUF block formats against llama.cpp's own library (tests/ggml_oracle.hpp): ggml
// quantizes random rows, then Troupe's reference dequantizer must give exactly the floats ggml's
// dequantizer gives, for every type Troupe loads. Both compute each value with the same float
// operations, so "exactly" is bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/half_float.hpp"
#include "model/loader/gguf_types.hpp"
#include "model/quant/dequantize.hpp"
#include "model/quant/fp8.hpp"
#include "tests/ggml_oracle.hpp"
#include "tests/model/quant_test_data.hpp"

namespace troupe {
namespace {

struct format_case {
  dtype type;
  const char* ggml_symbol;  // as ggml's dequantize_row_<symbol> spells it
};

const std::vector<format_case> gguf_quantized = {
    {dtype::q4_0, "q4_0"},   {dtype::q4_1, "q4_1"}, {dtype::q5_0, "q5_0"},     {dtype::q5_1, "q5_1"},
    {dtype::q8_0, "q8_0"},   {dtype::q2_k, "q2_K"}, {dtype::q3_k, "q3_K"},     {dtype::q4_k, "q4_K"},
    {dtype::q5_k, "q5_K"},   {dtype::q6_k, "q6_K"}, {dtype::iq4_nl, "iq4_nl"}, {dtype::iq4_xs, "iq4_xs"},
    {dtype::mxfp4, "mxfp4"},
};

using testing::random_rows;

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, size_t* first_difference) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      *first_difference = i;
      return false;
    }
  }
  return a.size() == b.size();
}

TEST(quant_formats, every_gguf_type_decodes_exactly_as_ggml_does) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const auto& oracle = testing::ggml_oracle::instance();
  constexpr int64_t rows = 7, per_row = 512;
  const std::vector<float> values = random_rows(rows, per_row, 42);
  for (const format_case& c : gguf_quantized) {
    const size_t row_size = row_bytes(c.type, per_row);
    const std::vector<std::byte> blocks =
        oracle.quantize(static_cast<uint32_t>(gguf_type_of(c.type)), values.data(), rows, per_row, row_size);
    const std::vector<float> theirs = oracle.dequantize(c.ggml_symbol, blocks.data(), rows * per_row);
    std::vector<float> ours(values.size());
    quant::dequantize_row(c.type, blocks.data(), ours.data(), rows * per_row);
    size_t at = 0;
    EXPECT_TRUE(bitwise_equal(ours, theirs, &at))
        << dtype_name(c.type) << ": element " << at << " is " << ours[at] << ", ggml says " << theirs[at];
    // And the quantization was not trivial: the decoded row follows the input.
    double error = 0, norm = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      error += (ours[i] - values[i]) * (ours[i] - values[i]);
      norm += values[i] * values[i];
    }
    EXPECT_LT(std::sqrt(error / norm), 0.5) << dtype_name(c.type);
  }
}

TEST(quant_formats, block_sizes_are_ggmls) {
  // Bytes of one 256-element row of each type, from ggml's own block structs.
  const std::vector<std::pair<dtype, size_t>> expected = {
      {dtype::q4_0, 8 * 18},  {dtype::q4_1, 8 * 20}, {dtype::q5_0, 8 * 22},   {dtype::q5_1, 8 * 24},
      {dtype::q8_0, 8 * 34},  {dtype::q2_k, 84},     {dtype::q3_k, 110},      {dtype::q4_k, 144},
      {dtype::q5_k, 176},     {dtype::q6_k, 210},    {dtype::iq4_nl, 8 * 18}, {dtype::iq4_xs, 136},
      {dtype::mxfp4, 8 * 17}, {dtype::f16, 512},     {dtype::bf16, 512},      {dtype::f32, 1024},
  };
  for (const auto& [type, bytes] : expected) EXPECT_EQ(row_bytes(type, 256), bytes) << dtype_name(type);
}

TEST(quant_formats, names_parse_in_any_case_and_ggml_names_every_type) {
  EXPECT_EQ(dtype_from_name("Q4_K"), dtype::q4_k);
  EXPECT_EQ(dtype_from_name("iq4_XS"), dtype::iq4_xs);
  EXPECT_EQ(dtype_from_name("q4_k_m"), std::nullopt);
  for (int i = 0; i < num_dtypes; ++i)
    EXPECT_EQ(dtype_from_name(dtype_name(static_cast<dtype>(i))), static_cast<dtype>(i));
  EXPECT_EQ(ggml_type_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_type_name(39), "MXFP4");
  EXPECT_EQ(ggml_type_name(99), "type 99");
  for (const format_case& c : gguf_quantized) EXPECT_EQ(dtype_of(static_cast<uint32_t>(gguf_type_of(c.type))), c.type);
  EXPECT_EQ(dtype_of(16), std::nullopt);  // IQ2_XXS: refused by name where a tensor uses it
}

TEST(quant_formats, a_non_finite_scale_is_found_by_block) {
  std::vector<float> values = random_rows(1, 1024, 7);
  for (dtype type : {dtype::q8_0, dtype::q4_1, dtype::q2_k, dtype::q3_k, dtype::q4_k, dtype::q6_k, dtype::iq4_xs}) {
    if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
    std::vector<std::byte> blocks = testing::ggml_oracle::instance().quantize(
        static_cast<uint32_t>(gguf_type_of(type)), values.data(), 1, 1024, row_bytes(type, 1024));
    EXPECT_EQ(quant::first_bad_scale_block(type, blocks.data(), 1024), std::nullopt) << dtype_name(type);
    // Poison the last f16 scale field of block 2 (for q2_k that is dmin, for q4_1 the min).
    const size_t block_bytes = dtype_traits_of(type).block_bytes;
    const size_t field = type == dtype::q2_k                          ? 82
                         : type == dtype::q3_k                        ? 108
                         : type == dtype::q6_k                        ? 208
                         : type == dtype::q4_1 || type == dtype::q4_k ? 2
                                                                      : 0;
    const uint16_t nan_bits = 0x7e00;
    const int64_t bad_block = dtype_block_size(type) == 256 ? 2 : 5;
    std::memcpy(blocks.data() + bad_block * block_bytes + field, &nan_bits, 2);
    EXPECT_EQ(quant::first_bad_scale_block(type, blocks.data(), 1024), bad_block) << dtype_name(type);
  }
  std::vector<std::byte> mx(17 * 4, std::byte{0});
  mx[17 * 3] = std::byte{0xff};
  EXPECT_EQ(quant::first_bad_scale_block(dtype::mxfp4, mx.data(), 128), 3);
  EXPECT_EQ(quant::first_bad_scale_block(dtype::f16, mx.data(), 4), std::nullopt);
}

TEST(quant_formats, fp8_e4m3_round_trips_every_code_and_rounds_to_nearest_even) {
  for (int code = 0; code < 256; ++code) {
    const float value = quant::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(quant::f32_to_fp8_e4m3(value), code) << "code " << code << " value " << value;
  }
  EXPECT_EQ(quant::fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(quant::fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(quant::fp8_e4m3_to_f32(0x38), 1.0f);
  // Halfway between 1 (mantissa 0, even) and 1.125 (mantissa 1): to 1; between 1.125 and 1.25: to 1.25.
  EXPECT_EQ(quant::f32_to_fp8_e4m3(1.0625f), 0x38);
  EXPECT_EQ(quant::f32_to_fp8_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(quant::f32_to_fp8_e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(quant::f32_to_fp8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(quant::f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest step: to zero
  EXPECT_EQ(quant::f32_to_fp8_e4m3(-0.0f), 0x80);
}

}  // namespace
}  // namespace troupe
