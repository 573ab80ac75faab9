// The KV span of issue 11 without a backend: its byte size follows the documented layout and
// refuses to overflow, conversions round to nearest even, and a backend without KV transfer says
// which backend it is.

#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/half_float.hpp"
#include "model/kv_transfer.hpp"
#include "model/model.hpp"

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
