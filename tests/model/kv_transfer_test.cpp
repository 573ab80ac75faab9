// The KV span of issue 11 without a backend: its byte size follows the documented layout and
// refuses to overflow, conversions round to nearest even, and a backend without KV transfer says
// which backend it is.

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/half_float.hpp"
#include "model/kv_transfer.hpp"
#include "model/model.hpp"
#include "tests/ggml_oracle.hpp"

namespace troupe {
namespace {

std::string refusal_of(const kv_span_header& header) {
  try {
    kv_span_bytes(header);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(kv_span, byte_size_follows_the_layout) {
  // [num_layers 2, K/V 2, blocks 3, block_size 4, kv_heads 5, head_dim 6] of 2-byte elements.
  EXPECT_EQ(kv_span_bytes({1, 2, 3, 4, 5, 6, dtype::f16}), size_t{2} * 2 * 3 * 4 * 5 * 6 * 2);
  EXPECT_EQ(kv_span_bytes({0, 1, 1, 1, 1, 1, dtype::f32}), size_t{8});
}

TEST(kv_span, refuses_overflow_and_bad_fields_by_name) {
  EXPECT_NE(refusal_of({0, INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX, dtype::f32}).find("overflows"),
            std::string::npos);
  EXPECT_NE(refusal_of({0, 1, 0, 4, 5, 6, dtype::f32}).find("num_blocks"), std::string::npos);
  EXPECT_NE(refusal_of({-1, 1, 1, 4, 5, 6, dtype::f32}).find("first_layer"), std::string::npos);
  EXPECT_NE(refusal_of({0, 1, 1, 4, 5, -6, dtype::f32}).find("head_dim"), std::string::npos);
  EXPECT_NE(refusal_of({0, 1, 1, 4, 5, 6, dtype::q8_0}).find("q8_0"), std::string::npos);
}

TEST(kv_span, conversions_round_to_nearest_even) {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159f, 65504.0f, 1e-6f, -2.71828f};
  std::vector<std::byte> f32(values.size() * 4), half(values.size() * 2), back(values.size() * 4);
  std::memcpy(f32.data(), values.data(), f32.size());
  for (dtype element : {dtype::f16, dtype::bf16}) {
    convert_kv_elements(dtype::f32, f32.data(), element, half.data(), values.size());
    convert_kv_elements(element, half.data(), dtype::f32, back.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits;
      float value;
      std::memcpy(&bits, half.data() + 2 * i, 2);
      std::memcpy(&value, back.data() + 4 * i, 4);
      const uint16_t want = element == dtype::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      EXPECT_EQ(bits, want) << dtype_name(element) << " element " << i;
      EXPECT_EQ(value, element == dtype::f16 ? f16_to_f32(want) : bf16_to_f32(want)) << dtype_name(element);
    }
  }
}

TEST(kv_span, quantized_kv_types_size_their_runs_by_blocks) {
  // q8_0: 34 bytes per 32 elements, so head_dim must be a multiple of 32; fp8: one byte each.
  EXPECT_EQ(kv_span_bytes({0, 2, 3, 16, 2, 64, dtype::q8_0}), size_t{2} * 2 * 3 * 16 * 2 * 64 / 32 * 34);
  EXPECT_EQ(kv_span_bytes({0, 2, 3, 16, 2, 64, dtype::fp8_e4m3}), size_t{2} * 2 * 3 * 16 * 2 * 64);
  EXPECT_NE(refusal_of({0, 1, 1, 16, 2, 80, dtype::q8_0}).find("head_dim 80"), std::string::npos);
  EXPECT_NE(refusal_of({0, 1, 1, 16, 2, 64, dtype::q4_k}).find("q4_k is not one of"), std::string::npos);
  EXPECT_TRUE(is_kv_element(dtype::fp8_e4m3));
  EXPECT_FALSE(is_kv_element(dtype::q4_0));
}

// Any KV type to any other goes through f32: decode(from), then encode(to); q8_0 as GGUF's blocks
// (llama.cpp's own quantizer, tests/ggml_oracle.hpp, writes the same bytes: its halves round away
// from zero, ours to even, and random values never sit exactly between two steps).
TEST(kv_span, conversions_between_every_kv_type_go_through_f32) {
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::fp8_e4m3};
  const size_t count = 32 * 8;
  std::vector<float> values(count);
  uint32_t state = 12345;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 20.0f;
  }
  values[5] = 1000.0f;  // fp8 saturates at 448
  values[6] = 0.0f;
  for (dtype from : types) {
    std::vector<std::byte> in(kv_bytes(from, count));
    kv_encode_f32(from, values.data(), in.data(), count);
    std::vector<float> decoded(count);
    kv_decode_f32(from, in.data(), decoded.data(), count);
    for (dtype to : types) {
      std::vector<std::byte> want(kv_bytes(to, count)), got(want.size());
      kv_encode_f32(to, decoded.data(), want.data(), count);
      convert_kv_elements(from, in.data(), to, got.data(), count);
      EXPECT_EQ(got, want) << dtype_name(from) << " -> " << dtype_name(to);
    }
    // The round trip's error is the type's: exact for f32, 2^-9 / 2^-12 relative for bf16 / f16,
    // a sixteenth for fp8's 3 mantissa bits, half a step of max|block| / 127 for q8_0.
    for (size_t i = 0; i < count; ++i) {
      const double x = values[i], y = decoded[i];
      const double bound = from == dtype::f32    ? 0.0
                           : from == dtype::f16  ? std::fabs(x) * 0x1p-11
                           : from == dtype::bf16 ? std::fabs(x) * 0x1p-8
                           : from == dtype::fp8_e4m3
                               ? (std::fabs(x) > 448 ? std::fabs(x) - 448 : std::fabs(x) / 16 + 0x1p-10)
                               : 1000.0 / 127 / 2 * 1.001;
      ASSERT_LE(std::fabs(x - y), bound) << dtype_name(from) << " element " << i << ": " << x << " became " << y;
    }
  }
  EXPECT_THROW(convert_kv_elements(dtype::f32, nullptr, dtype::q8_0, nullptr, 33), std::invalid_argument);
}

TEST(kv_span, q8_0_encoding_matches_llama_cpp_quantizer) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const size_t count = 32 * 64;
  std::vector<float> values(count);
  uint32_t state = 777;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 6.0f;
  }
  std::vector<std::byte> ours(kv_bytes(dtype::q8_0, count));
  kv_encode_f32(dtype::q8_0, values.data(), ours.data(), count);
  const std::vector<std::byte> theirs =
      testing::ggml_oracle::instance().quantize(8 /* GGML_TYPE_Q8_0 */, values.data(), 1, count, ours.size());
  EXPECT_EQ(ours, theirs);
}

// A backend that has not implemented KV transfer.
class no_transfer_model final : public model {
 public:
  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return {}; }
  std::string backend_name() const override { return "test-backend-7"; }
  void forward(const forward_batch&, float*) override {}

 private:
  model_config config_;
};

TEST(kv_span, a_backend_without_transfer_names_itself) {
  no_transfer_model m;
  std::vector<std::byte> bytes(8);
  const std::vector<int32_t> ids = {0};
  try {
    m.import_kv(ids, {0, 1, 1, 1, 1, 1, dtype::f32}, bytes);
    ADD_FAILURE() << "import accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("test-backend-7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.export_kv(ids, 0, 1, dtype::f32, bytes), std::runtime_error);
  EXPECT_THROW(m.kv_dtype(), std::runtime_error);
}

}  // namespace
}  // namespace troupe
