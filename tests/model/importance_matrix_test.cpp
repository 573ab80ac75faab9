// Importance matrices in both of llama.cpp's formats (written as its imatrix tool writes them,
// tests/model/importance_files.hpp) read back to the same means, and broken files are refused
// naming the file and entry.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/loader/importance_matrix.hpp"
#include "tests/model/importance_files.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using testing::expect_error;

const std::map<std::string, std::vector<float>> means = {
    {"blk.0.attn_q.weight", {0.5f, 2.0f, 0.0f, 7.25f}},
    {"blk.0.ffn_down.weight", {1.0f, 3.0f, 0.125f, 9.0f, 4.0f, 0.0f, 1e-3f, 2.5f}},
};

TEST(importance_matrix, both_formats_read_back_the_means) {
  testing::scratch_dir dir;
  testing::write_gguf_imatrix(dir / "m.gguf", means, 384.0f);
  testing::write_legacy_imatrix(dir / "m.dat", means, 7);
  for (const char* name : {"m.gguf", "m.dat"}) {
    const importance_matrix matrix = load_importance_matrix(dir / name);
    ASSERT_EQ(matrix.entries.size(), means.size()) << name;
    for (const auto& [tensor, expected] : means) {
      const std::vector<float>* values = matrix.find(tensor);
      ASSERT_NE(values, nullptr) << name << " " << tensor;
      ASSERT_EQ(values->size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i)
        EXPECT_NEAR((*values)[i], expected[i], 1e-6f * (1 + expected[i])) << name;
    }
    EXPECT_EQ(matrix.find("blk.1.attn_q.weight"), nullptr);
    EXPECT_EQ(matrix.datasets, std::vector<std::string>{"calibration.txt"}) << name;
    EXPECT_EQ(matrix.chunk_count, 4) << name;
  }
  EXPECT_FALSE(load_importance_matrix(dir / "m.gguf").legacy_format);
  EXPECT_TRUE(load_importance_matrix(dir / "m.dat").legacy_format);
}

TEST(importance_matrix, a_matrix_no_token_reached_counts_as_uniform) {
  // An expert never chosen has count 0: llama.cpp reads its means as 1.
  testing::scratch_dir dir;
  gguf_writer writer;
  const std::vector<float> sums = {4, 8, 5, 5}, counts = {2, 0};  // two matrices of two columns
  std::vector<std::byte> sum_bytes(16), count_bytes(8);
  std::memcpy(sum_bytes.data(), sums.data(), 16);
  std::memcpy(count_bytes.data(), counts.data(), 8);
  writer.add_tensor("blk.0.ffn_up_exps.weight.in_sum2", gguf_tensor_type::f32, {2, 2}, sum_bytes);
  writer.add_tensor("blk.0.ffn_up_exps.weight.counts", gguf_tensor_type::f32, {1, 2}, count_bytes);
  writer.write(dir / "experts.gguf");
  const importance_matrix matrix = load_importance_matrix(dir / "experts.gguf");
  EXPECT_EQ(*matrix.find("blk.0.ffn_up_exps.weight"), (std::vector<float>{2, 4, 1, 1}));
}

TEST(importance_matrix, broken_files_are_refused_naming_file_and_entry) {
  testing::scratch_dir dir;
  testing::write_legacy_imatrix(dir / "m.dat", means);
  const std::string whole = testing::read_text(dir / "m.dat");
  testing::write_text(dir / "cut.dat", whole.substr(0, 40));
  expect_error([&] { load_importance_matrix(dir / "cut.dat"); }, {"cut.dat", "truncated", "blk.0.attn_q.weight"});
  testing::write_text(dir / "empty.dat", "");
  expect_error([&] { load_importance_matrix(dir / "empty.dat"); }, {"empty.dat"});
  testing::write_text(dir / "text.dat", "this is not an importance matrix at all");
  expect_error([&] { load_importance_matrix(dir / "text.dat"); }, {"text.dat", "entries"});
  expect_error([&] { load_importance_matrix(dir / "none.dat"); }, {"none.dat", "cannot be opened"});

  testing::write_legacy_imatrix(dir / "negative.dat", {{"blk.0.attn_k.weight", {1.0f, -2.0f}}});
  expect_error([&] { load_importance_matrix(dir / "negative.dat"); },
               {"negative.dat", "blk.0.attn_k.weight", "value 1"});
  testing::write_gguf_imatrix(dir / "nan.gguf", {{"blk.0.attn_k.weight", {1.0f, NAN}}});
  expect_error([&] { load_importance_matrix(dir / "nan.gguf"); }, {"nan.gguf", "blk.0.attn_k.weight", "finite"});

  gguf_writer no_counts;
  no_counts.add_tensor("blk.0.attn_q.weight.in_sum2", gguf_tensor_type::f32, {2, 1}, std::vector<std::byte>(8));
  no_counts.write(dir / "no_counts.gguf");
  expect_error([&] { load_importance_matrix(dir / "no_counts.gguf"); },
               {"no_counts.gguf", "blk.0.attn_q.weight", "no counts"});

  gguf_writer f16_sums;
  f16_sums.add_tensor("blk.0.attn_q.weight.in_sum2", gguf_tensor_type::f16, {2, 1}, std::vector<std::byte>(4));
  f16_sums.add_tensor("blk.0.attn_q.weight.counts", gguf_tensor_type::f32, {1, 1}, std::vector<std::byte>(4));
  f16_sums.write(dir / "f16.gguf");
  expect_error([&] { load_importance_matrix(dir / "f16.gguf"); },
               {"f16.gguf", "blk.0.attn_q.weight.in_sum2", "F16", "F32"});

  gguf_writer model_file;
  model_file.add_tensor("token_embd.weight", gguf_tensor_type::f32, {2, 1}, std::vector<std::byte>(8));
  model_file.write(dir / "model.gguf");
  expect_error([&] { load_importance_matrix(dir / "model.gguf"); }, {"model.gguf", "in_sum2"});
}

}  // namespace
}  // namespace troupe
