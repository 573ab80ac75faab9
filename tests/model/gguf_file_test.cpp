#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_writer.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using testing::expect_error;

std::vector<std::byte> as_bytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(gguf_file, reads_stories260k_metadata_and_tensors) {
  gguf_file file = gguf_file::open(testing::shared_model_dir() / "gguf/stories260K-f32.gguf");
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.get_string("general.architecture"), "llama");
  EXPECT_EQ(file.get_int("llama.block_count"), 5);
  EXPECT_EQ(file.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_NEAR(file.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(file.get_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(file.get_array("tokenizer.ggml.tokens")[1], "<s>");
  EXPECT_EQ(file.find_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(file.tensors().size(), 48u);
  const gguf_tensor_info* k = file.find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->dims, (std::vector<int64_t>{64, 32}));     // innermost first
  EXPECT_EQ(k->shape(), (std::vector<int64_t>{32, 64}));  // [out, in]
  EXPECT_EQ(k->num_bytes, 32u * 64 * 4);
}

TEST(gguf_file, write_read_round_trip_of_all_value_types_and_tensor_types) {
  testing::scratch_dir dir;
  gguf_writer writer;
  writer.set("general.architecture", gguf_value::string("llama"));
  writer.set("u8", {gguf_value_type::uint8, gguf_value_type::uint8, 200});
  writer.set("i8", {gguf_value_type::int8, gguf_value_type::uint8, -100});
  writer.set("u16", {gguf_value_type::uint16, gguf_value_type::uint8, 60000});
  writer.set("i16", {gguf_value_type::int16, gguf_value_type::uint8, -30000});
  writer.set("u32", gguf_value::u32(4000000000u));
  writer.set("i32", gguf_value::i32(-2000000000));
  writer.set("u64", gguf_value::u64(1ull << 40));
  writer.set("i64", {gguf_value_type::int64, gguf_value_type::uint8, -(1ll << 40)});
  writer.set("f32", gguf_value::f32(0.5f));
  writer.set("f64", {gguf_value_type::float64, gguf_value_type::uint8, 0.1});
  writer.set("flag", gguf_value::boolean(true));
  writer.set("strings", gguf_value::array(gguf_value_type::string, {"a", "b c", "\xe2\x96\x81x"}));
  writer.set("floats", gguf_value::array(gguf_value_type::float32, {1.5, -2.0}));
  writer.set("ints", gguf_value::array(gguf_value_type::int32, {1, -2, 3}));

  std::vector<float> values(64 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * i) * (1 + i % 5);
  writer.add_tensor("f32", gguf_tensor_type::f32, {64, 3}, as_bytes(values));
  std::vector<std::byte> f16(values.size() * 2), bf16(values.size() * 2), q8(values.size() / 32 * 34);
  convert_from_f32(values, dtype::f16, f16.data());
  convert_from_f32(values, dtype::bf16, bf16.data());
  convert_from_f32(values, dtype::q8_0, q8.data());
  writer.add_tensor("f16", gguf_tensor_type::f16, {64, 3}, f16);
  writer.add_tensor("bf16", gguf_tensor_type::bf16, {64, 3}, bf16);
  writer.add_tensor("q8", gguf_tensor_type::q8_0, {64, 3}, q8);
  writer.add_tensor("odd", gguf_tensor_type::f32, {5}, as_bytes({1, 2, 3, 4, 5}));  // forces padding
  writer.write(dir / "t.gguf");

  gguf_file file = gguf_file::open(dir / "t.gguf");
  EXPECT_EQ(file.get_int("u8"), 200);
  EXPECT_EQ(file.get_int("i8"), -100);
  EXPECT_EQ(file.get_int("u16"), 60000);
  EXPECT_EQ(file.get_int("i16"), -30000);
  EXPECT_EQ(file.get_int("u32"), 4000000000ll);
  EXPECT_EQ(file.get_int("i32"), -2000000000);
  EXPECT_EQ(file.get_int("u64"), 1ll << 40);
  EXPECT_EQ(file.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(file.get_float("f32"), 0.5);
  EXPECT_EQ(file.get_float("f64"), 0.1);
  EXPECT_EQ(file.find_bool("flag"), true);
  EXPECT_EQ(file.find("strings")->element_type, gguf_value_type::string);
  EXPECT_EQ(file.get_array("strings"), nlohmann::json({"a", "b c", "\xe2\x96\x81x"}));
  EXPECT_EQ(file.get_array("floats"), nlohmann::json({1.5, -2.0}));
  EXPECT_EQ(file.get_array("ints"), nlohmann::json({1, -2, 3}));
  EXPECT_EQ(file.keys().front(), "general.architecture");

  for (const char* name : {"f32", "f16", "bf16", "q8", "odd"}) {
    const gguf_tensor_info* info = file.find_tensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(info->data) % 32, 0u) << name;
  }
  weight_tensor q8_view = file.view(*file.find_tensor("q8"), "model.q8");
  EXPECT_EQ(q8_view.type, dtype::q8_0);
  EXPECT_EQ(q8_view.shape, (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(q8_view.num_bytes, q8.size());
  EXPECT_EQ(std::memcmp(q8_view.data, q8.data(), q8.size()), 0);
  // Q8_0 error is at most half a quantization step (max|x| / 127 / 2) per block.
  std::vector<float> back(values.size());
  convert_to_f32(q8_view.data, dtype::q8_0, back);
  for (size_t block = 0; block < values.size() / 32; ++block) {
    float max_abs = 0;
    for (int i = 0; i < 32; ++i) max_abs = std::max(max_abs, std::fabs(values[block * 32 + i]));
    for (int i = 0; i < 32; ++i)
      EXPECT_NEAR(back[block * 32 + i], values[block * 32 + i], max_abs / 127 * 0.51f + 1e-3f);
  }
  std::vector<float> f16_back(values.size());
  convert_to_f32(file.find_tensor("f16")->data, dtype::f16, f16_back);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(f16_back[i], values[i], std::fabs(values[i]) * 1e-3f);
  EXPECT_EQ(std::memcmp(file.find_tensor("f32")->data, values.data(), values.size() * 4), 0);
}

TEST(gguf_file, truncated_and_lying_files_are_rejected) {
  testing::scratch_dir dir;
  std::string whole = testing::read_text(testing::shared_model_dir() / "gguf/stories260K-f32.gguf");
  testing::write_text(dir / "cut.gguf", whole.substr(0, whole.size() - 1000));
  expect_error([&] { gguf_file::open(dir / "cut.gguf"); }, {"cut.gguf", "outside", "truncated"});
  testing::write_text(dir / "head.gguf", whole.substr(0, 5000));  // inside the token array
  expect_error([&] { gguf_file::open(dir / "head.gguf"); }, {"head.gguf", "truncated"});
  std::string bad_magic = whole;
  bad_magic[0] = 'X';
  testing::write_text(dir / "magic.gguf", bad_magic);
  expect_error([&] { gguf_file::open(dir / "magic.gguf"); }, {"magic.gguf", "magic"});
  std::string huge_count = whole;
  uint64_t lie = 1ull << 40;
  std::memcpy(huge_count.data() + 8, &lie, 8);  // tensor count
  testing::write_text(dir / "count.gguf", huge_count);
  expect_error([&] { gguf_file::open(dir / "count.gguf"); }, {"count.gguf", "tensor count"});
  expect_error([&] { gguf_file::open(dir / "none.gguf"); }, {"none.gguf", "does not exist"});
}

TEST(gguf_file, unsupported_tensor_type_is_named_when_used) {
  testing::scratch_dir dir;
  gguf_writer writer;
  writer.add_tensor("blk.0.attn_q.weight", static_cast<gguf_tensor_type>(16), {256},
                    std::vector<std::byte>(66));  // IQ2_XXS
  writer.write(dir / "iq2.gguf");
  gguf_file file = gguf_file::open(dir / "iq2.gguf");
  expect_error([&] { file.view(file.tensors()[0], "x"); }, {"type IQ2_XXS", "blk.0.attn_q.weight", "iq2.gguf", "Q4_K"});
}

}  // namespace
}  // namespace troupe
