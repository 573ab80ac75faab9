// A model weighed by its files' headers alone (model/loader/model_part_bytes.hpp), as a topology
// that cuts it into pipeline stages by bytes reads it: stories260K's HF directory and its GGUF file
// hold the same f32 tensors, so they weigh the same.

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "model/loader/model_part_bytes.hpp"
#include "tests/model/loader_test_util.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

TEST(model_part_bytes, names_their_part_in_either_naming) {
  EXPECT_EQ(part_of_tensor("model.layers.12.mlp.up_proj.weight").kind, tensor_part::layer);
  EXPECT_EQ(part_of_tensor("model.layers.12.mlp.up_proj.weight").layer_index, 12);
  EXPECT_EQ(part_of_tensor("blk.3.ffn_up.weight").layer_index, 3);
  EXPECT_EQ(part_of_tensor("blk.3.ffn_up.weight").kind, tensor_part::layer);
  EXPECT_EQ(part_of_tensor("model.embed_tokens.weight").kind, tensor_part::embedding);
  EXPECT_EQ(part_of_tensor("token_embd.weight").kind, tensor_part::embedding);
  for (const char* head : {"lm_head.weight", "model.norm.weight", "output.weight", "output_norm.weight"}) {
    EXPECT_EQ(part_of_tensor(head).kind, tensor_part::head) << head;
  }
  for (const char* other : {"rope_freqs.weight", "blk.x.ffn_up.weight", "blk.3", "model.layers..q", "blk.-1.a"}) {
    EXPECT_EQ(part_of_tensor(other).kind, tensor_part::other) << other;
  }
}

TEST(model_part_bytes, stories260k_weighs_the_same_from_its_hf_directory_and_its_gguf_file) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "gguf/stories260K-f32.gguf");
  const model_part_bytes hf = read_model_part_bytes(test::stories260k_dir / "hf");
  const model_part_bytes gguf = read_model_part_bytes(test::stories260k_dir / "gguf/stories260K-f32.gguf");
  // dim 64, 8 heads of 8 over 4 KV heads, FFN 172, vocabulary 512, all f32: a layer's seven
  // matrices and two norms are 45,440 floats. The HF head is tied to the embedding; the GGUF file
  // stores it as output.weight: the same bytes either way.
  EXPECT_EQ(hf.layers, std::vector<size_t>(5, 181760));
  EXPECT_EQ(hf.embedding, 512u * 64 * 4);
  EXPECT_EQ(hf.head, 64u * 4 + hf.embedding) << "the final norm and the tied embedding";
  EXPECT_EQ(gguf.layers, hf.layers);
  EXPECT_EQ(gguf.embedding, hf.embedding);
  EXPECT_EQ(gguf.head, hf.head);
  // A stage's bytes: its layers, and the end it holds.
  EXPECT_EQ(hf.bytes_of({0, 2}), hf.embedding + 2 * 181760);
  EXPECT_EQ(hf.bytes_of({2, 4}), 2u * 181760);
  EXPECT_EQ(hf.bytes_of({4, 5}), 181760 + hf.head);
}

TEST(model_part_bytes, a_path_that_is_no_model_is_named) {
  testing::expect_error([] { read_model_part_bytes("/no/such/model"); }, {"/no/such/model"});
}

}  // namespace
}  // namespace troupe
