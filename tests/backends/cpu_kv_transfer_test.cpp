// KV export and import on the CPU backend (issue 11, first step): stories260K's KV moved from one
// model instance to another at other block ids continues exactly as the original (bitwise in f32,
// within tolerance through f16 / bf16, whole or as two layer ranges), and every bad request is
// refused by name before anything is written.

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "model/half_float.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/kv_transfer_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using test::kv_transfer_prompt;

const std::vector<int32_t> blocks_a = {5, 2, 9};   // the exporter's blocks
const std::vector<int32_t> blocks_b = {0, 11, 6};  // the importer's: other ids on purpose

class cpu_kv_transfer : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
    loaded_ = std::make_unique<loaded_model>(load_model(load_options{(test::stories260k_dir / "hf").string()}));
    a_ = make_cpu_model(loaded_->config, loaded_->weights, {16, 4}, 1);
    b_ = make_cpu_model(loaded_->config, loaded_->weights, {16, 4}, 1);
    next_ = test::prefill(*a_, kv_transfer_prompt, blocks_a);
    expected_ = test::decode_logits(*a_, kv_transfer_prompt, next_, blocks_a);
  }

  int num_layers() const { return loaded_->config.num_layers; }

  // B's whole pool, every layer of every block, to see that a refused call wrote nothing.
  std::vector<std::byte> whole_pool_of_b() const {
    std::vector<int32_t> all(b_->kv_shape().num_blocks);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
    const kv_span_header header =
        kv_span_for(b_->config(), b_->kv_shape(), static_cast<int>(all.size()), 0, num_layers(), dtype::f32);
    std::vector<std::byte> pool(kv_span_bytes(header));
    b_->export_kv(all, 0, num_layers(), dtype::f32, pool);
    return pool;
  }

  std::unique_ptr<loaded_model> loaded_;
  std::unique_ptr<model> a_, b_;
  int32_t next_ = 0;
  std::vector<float> expected_;  // [vocab] A's logits of the decode step after the prompt
};

TEST_F(cpu_kv_transfer, all_layers_in_f32_continue_bitwise_equal) {
  test::move_kv(*a_, blocks_a, *b_, blocks_b, 0, num_layers(), dtype::f32);
  EXPECT_EQ(test::decode_logits(*b_, kv_transfer_prompt, next_, blocks_b), expected_);
}

TEST_F(cpu_kv_transfer, without_the_import_the_decode_step_differs) {
  // The control: B's own empty blocks do not give A's logits, so the equality above means something.
  EXPECT_NE(test::decode_logits(*b_, kv_transfer_prompt, next_, blocks_b), expected_);
}

TEST_F(cpu_kv_transfer, two_layer_ranges_continue_bitwise_equal) {
  const int first_part = num_layers() / 2;
  test::move_kv(*a_, blocks_a, *b_, blocks_b, 0, first_part, dtype::f32);
  test::move_kv(*a_, blocks_a, *b_, blocks_b, first_part, num_layers() - first_part, dtype::f32);
  EXPECT_EQ(test::decode_logits(*b_, kv_transfer_prompt, next_, blocks_b), expected_);
}

TEST_F(cpu_kv_transfer, only_the_layers_moved_are_written) {
  // One layer short of the whole: layer 0 of B stays empty (checked before a decode step writes
  // its new token there) and the decode step differs from A's.
  test::move_kv(*a_, blocks_a, *b_, blocks_b, 1, num_layers() - 1, dtype::f32);
  const kv_span_header first = kv_span_for(b_->config(), b_->kv_shape(), 3, 0, 1, dtype::f32);
  std::vector<std::byte> layer0(kv_span_bytes(first));
  b_->export_kv(blocks_b, 0, 1, dtype::f32, layer0);
  for (std::byte value : layer0) ASSERT_EQ(value, std::byte{0}) << "layer 0 of B was written";
  EXPECT_NE(test::decode_logits(*b_, kv_transfer_prompt, next_, blocks_b), expected_);
}

TEST_F(cpu_kv_transfer, through_f16_and_bf16_continue_within_tolerance) {
  for (dtype element : {dtype::f16, dtype::bf16}) {
    auto b = make_cpu_model(loaded_->config, loaded_->weights, {16, 4}, 1);
    test::move_kv(*a_, blocks_a, *b, blocks_b, 0, num_layers(), element);
    const std::vector<float> logits = test::decode_logits(*b, kv_transfer_prompt, next_, blocks_b);
    // Measured: 0.007 (f16), 0.078 (bf16) on logits up to ~18; the bounds leave room for a
    // different SIMD level's rounding.
    const float tolerance = element == dtype::f16 ? 5e-2f : 2.5e-1f;
    EXPECT_LT(test::max_abs_difference(logits, expected_), tolerance) << dtype_name(element);
    EXPECT_EQ(test::argmax(logits.data(), static_cast<int>(logits.size())),
              test::argmax(expected_.data(), static_cast<int>(expected_.size())))
        << dtype_name(element);
  }
}

TEST_F(cpu_kv_transfer, export_in_f16_holds_the_rounded_pool_values) {
  const kv_span_header f32_header = kv_span_for(a_->config(), a_->kv_shape(), 3, 0, num_layers(), dtype::f32);
  const kv_span_header f16_header = kv_span_for(a_->config(), a_->kv_shape(), 3, 0, num_layers(), dtype::f16);
  std::vector<std::byte> wide(kv_span_bytes(f32_header)), narrow(kv_span_bytes(f16_header));
  ASSERT_EQ(narrow.size() * 2, wide.size());
  a_->export_kv(blocks_a, 0, num_layers(), dtype::f32, wide);
  a_->export_kv(blocks_a, 0, num_layers(), dtype::f16, narrow);
  size_t num_nonzero = 0;
  for (size_t i = 0; i < narrow.size() / 2; ++i) {
    float value;
    uint16_t bits;
    std::memcpy(&value, wide.data() + 4 * i, 4);
    std::memcpy(&bits, narrow.data() + 2 * i, 2);
    ASSERT_EQ(bits, f32_to_f16(value)) << "element " << i;
    num_nonzero += value != 0.0f;
  }
  EXPECT_GT(num_nonzero, narrow.size() / 4);  // the prompt's KV, not an empty pool
}

TEST_F(cpu_kv_transfer, refusals_name_the_field_and_write_nothing) {
  const int layers = num_layers();
  const kv_span_header good = kv_span_for(a_->config(), a_->kv_shape(), 3, 0, layers, dtype::f32);
  std::vector<std::byte> span(kv_span_bytes(good));
  a_->export_kv(blocks_a, 0, layers, dtype::f32, span);
  const std::vector<std::byte> before = whole_pool_of_b();

  auto expect_import_refused = [&](std::vector<int32_t> ids, kv_span_header header, std::vector<std::byte> data,
                                   const std::string& field) {
    try {
      b_->import_kv(ids, header, data);
      ADD_FAILURE() << "import accepted, expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what() << " does not name " << field;
    }
    EXPECT_EQ(whole_pool_of_b(), before) << "refused import (" << field << ") wrote into the pool";
  };
  auto with = [&](auto change) {
    kv_span_header header = good;
    change(header);
    return header;
  };
  std::vector<std::byte> short_span(span.begin(), span.end() - 1);
  std::vector<std::byte> long_span = span;
  long_span.push_back(std::byte{1});

  expect_import_refused({0, 11, 16}, good, span, "block id 16");
  expect_import_refused({0, -1, 6}, good, span, "block id -1");
  expect_import_refused({0, 11, 0}, good, span, "appears twice");
  expect_import_refused({0, 11}, good, span, "num_blocks");
  expect_import_refused(blocks_b, with([](auto& h) { h.head_dim += 1; }), span, "head_dim");
  expect_import_refused(blocks_b, with([](auto& h) { h.block_size = 8; }), span, "block_size");
  expect_import_refused(blocks_b, with([](auto& h) { h.num_kv_heads = 8; }), span, "num_kv_heads");
  expect_import_refused(blocks_b, with([](auto& h) { h.first_layer = 1; }), span, "layer range");
  expect_import_refused(blocks_b, with([](auto& h) { h.first_layer = -1; }), span, "layer range");
  expect_import_refused(blocks_b, with([](auto& h) { h.element = dtype::q4_0; }), span, "q4_0 is not one of");
  // stories260K's heads are 8 wide: q8_0's blocks of 32 cannot hold them.
  expect_import_refused(blocks_b, with([](auto& h) { h.element = dtype::q8_0; }), span, "head_dim 8");
  expect_import_refused(blocks_b, good, short_span, "data size");
  expect_import_refused(blocks_b, good, long_span, "data size");

  auto expect_export_refused = [&](std::vector<int32_t> ids, int first, int count, size_t bytes,
                                   const std::string& field) {
    std::vector<std::byte> out(bytes, std::byte{0x5a});
    try {
      a_->export_kv(ids, first, count, dtype::f32, out);
      ADD_FAILURE() << "export accepted, expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what() << " does not name " << field;
    }
    for (std::byte value : out) ASSERT_EQ(value, std::byte{0x5a}) << "refused export (" << field << ") wrote out";
  };
  expect_export_refused({5, 2, 16}, 0, layers, span.size(), "block id 16");
  expect_export_refused(blocks_a, layers - 1, 2, span.size(), "layer range");
  expect_export_refused(blocks_a, 0, 0, span.size(), "layer range");
  expect_export_refused(blocks_a, 0, layers, span.size() - 1, "data size");
  expect_export_refused(blocks_a, 0, layers, span.size() + 1, "data size");
}

}  // namespace
}  // namespace troupe
