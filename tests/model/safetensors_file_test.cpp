#include <cstring>

#include <gtest/gtest.h>

#include "model/loader/safetensors_file.hpp"
#include "model/loader/safetensors_writer.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using testing::expect_error;

// A safetensors file written by hand: 8-byte header length, header text, data.
std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t length = header.size();
  std::memcpy(out.data(), &length, 8);
  return out + header + std::string(data_bytes, '\x01');
}

TEST(safetensors_file, reads_stories260k_with_every_tensor_in_bounds) {
  safetensors_file file = safetensors_file::open(testing::shared_model_dir() / "hf/model.safetensors");
  // 5 layers × 9 tensors + embeddings + final norm (tied: no lm_head).
  EXPECT_EQ(file.tensors().size(), 47u);
  size_t total = 0;
  for (const auto& t : file.tensors()) total += t.num_bytes;
  EXPECT_EQ(total, 260032u * 4);
  weight_store store;
  file.add_to(store);
  const weight_tensor& q = store.get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(q.type, dtype::f32);
  EXPECT_EQ(store.get("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{32, 64}));
}

TEST(safetensors_file, missing_file_is_named) {
  expect_error([] { safetensors_file::open("/nonexistent/model.safetensors"); },
               {"/nonexistent/model.safetensors", "does not exist"});
}

TEST(safetensors_file, truncated_file_is_named) {
  testing::scratch_dir dir;
  std::string whole = testing::read_text(testing::shared_model_dir() / "hf/model.safetensors");
  testing::write_text(dir / "short.safetensors", whole.substr(0, whole.size() / 2));
  expect_error([&] { safetensors_file::open(dir / "short.safetensors"); }, {"short.safetensors", "outside"});
  testing::write_text(dir / "tiny.safetensors", whole.substr(0, 5));
  expect_error([&] { safetensors_file::open(dir / "tiny.safetensors"); }, {"tiny.safetensors", "truncated"});
  testing::write_text(dir / "header.safetensors", whole.substr(0, 100));
  expect_error([&] { safetensors_file::open(dir / "header.safetensors"); }, {"header.safetensors", "header length"});
}

TEST(safetensors_file, lying_headers_are_rejected) {
  testing::scratch_dir dir;
  auto check = [&](const std::string& header, size_t data, std::initializer_list<std::string> parts) {
    testing::write_text(dir / "bad.safetensors", raw_file(header, data));
    expect_error([&] { safetensors_file::open(dir / "bad.safetensors"); }, parts);
  };
  // Size does not match shape × dtype.
  check(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24,
        {"bad.safetensors", "'w'", "20 bytes", "24"});
  // Offsets past the data area.
  check(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16, {"'w'", "outside"});
  // Overlapping tensors.
  check(
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16, {"'a'", "'b'", "overlap"});
  // Not JSON.
  check("{not json", 0, {"bad.safetensors", "JSON"});
  // Unsupported dtype.
  check(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16,
        {"unsupported dtype F64 in tensor w of file", "bad.safetensors"});
  // Integer tensors are read (a quantized checkpoint's packed weights) but are no weights.
  testing::write_text(dir / "ints.safetensors",
                      raw_file(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16));
  safetensors_file ints = safetensors_file::open(dir / "ints.safetensors");
  EXPECT_EQ(ints.tensors().at(0).integer_at(1), 0x0101010101010101);
  weight_store store;
  expect_error([&] { ints.add_to(store); },
               {"unsupported dtype I64 in tensor w of file", "ints.safetensors", "quantization_config"});
  // Negative dimension.
  check(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, {"'w'", "dimension"});
}

TEST(safetensors_file, write_then_read_keeps_names_shapes_and_bytes) {
  testing::scratch_dir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3c00, 0x4000, 0xbc00};
  std::vector<weight_tensor> tensors(2);
  tensors[0].name = "a";
  tensors[0].shape = {2, 3};
  tensors[0].data = reinterpret_cast<const std::byte*>(a.data());
  tensors[0].num_bytes = a.size() * 4;
  tensors[1].name = "b";
  tensors[1].type = dtype::bf16;
  tensors[1].shape = {3};
  tensors[1].data = reinterpret_cast<const std::byte*>(b.data());
  tensors[1].num_bytes = b.size() * 2;
  write_safetensors(dir / "x.safetensors", tensors);
  safetensors_file file = safetensors_file::open(dir / "x.safetensors");
  ASSERT_EQ(file.tensors().size(), 2u);
  weight_store store;
  file.add_to(store);
  EXPECT_EQ(store.get("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(store.get("a").data, a.data(), 24), 0);
  EXPECT_EQ(store.get("b").type, dtype::bf16);
  EXPECT_EQ(std::memcmp(store.get("b").data, b.data(), 6), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(store.get("a").data) % 8, 0u);
}

}  // namespace
}  // namespace troupe
