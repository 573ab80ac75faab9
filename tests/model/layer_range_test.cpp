// Pipeline stages' layer ranges (issue 27): parsing as topology files write them, the check that
// a pipeline's stages cover the model once, the even split by bytes, and which tensors a stage
// reads.

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/layer_range.hpp"
#include "model/model_tensors.hpp"

namespace troupe {
namespace {

std::string error_of(auto&& call) {
  try {
    call();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(layer_range, parses_inclusive_ranges_and_single_layers) {
  EXPECT_EQ(parse_layer_range("0-15", 32), (layer_range{0, 16}));
  EXPECT_EQ(parse_layer_range("16-31", 32), (layer_range{16, 32}));
  EXPECT_EQ(parse_layer_range("7", 32), (layer_range{7, 8}));
  EXPECT_EQ(layer_range_text({16, 32}), "16-31");
  EXPECT_EQ(parse_layer_range(layer_range_text({3, 9}), 32), (layer_range{3, 9}));
}

TEST(layer_range, refuses_bad_text_by_name) {
  EXPECT_NE(error_of([] { parse_layer_range("0-32", 32); }).find("the model has layers 0-31"), std::string::npos);
  EXPECT_NE(error_of([] { parse_layer_range("9-3", 32); }).find("comes before the first"), std::string::npos);
  for (const char* bad : {"", "-", "a-b", "1-", "-4", "1-2-3", " 1-2", "1.5"}) {
    EXPECT_NE(error_of([&] { parse_layer_range(bad, 32); }).find("expected FIRST-LAST"), std::string::npos) << bad;
  }
}

TEST(layer_range, default_is_the_whole_model) {
  const layer_range all = layer_range{}.resolved(5);
  EXPECT_EQ(all, (layer_range{0, 5}));
  EXPECT_TRUE(all.whole(5));
  EXPECT_TRUE(all.holds_embedding());
  EXPECT_TRUE(all.holds_head(5));
  EXPECT_FALSE((layer_range{1, 3}).holds_embedding());
  EXPECT_FALSE((layer_range{1, 3}).holds_head(5));
  EXPECT_EQ((layer_range{2, 0}).resolved(5), (layer_range{2, 5}));  // from layer 2 to the last
}

TEST(layer_range, pipeline_stages_must_cover_every_layer_once_in_order) {
  EXPECT_NO_THROW(check_pipeline_ranges({{0, 2}, {2, 5}}, 5));
  EXPECT_NE(error_of([] {
              check_pipeline_ranges({{0, 2}, {3, 5}}, 5);
            }).find("layers 2-2 are in no stage"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_pipeline_ranges({{0, 3}, {2, 5}}, 5);
            }).find("layer 2 is in an earlier stage"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_pipeline_ranges({{0, 2}, {2, 4}}, 5);
            }).find("layers 4-4 are in no stage"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_pipeline_ranges({}, 5); }).find("at least one stage"), std::string::npos);
}

TEST(layer_range, split_by_bytes_balances_the_stages) {
  const std::vector<size_t> equal(32, 100);
  EXPECT_EQ(split_layers_by_bytes(equal, 0, 0, 2), (std::vector<layer_range>{{0, 16}, {16, 32}}));
  EXPECT_EQ(split_layers_by_bytes(equal, 0, 0, 4), (std::vector<layer_range>{{0, 8}, {8, 16}, {16, 24}, {24, 32}}));
  // A large embedding on the first stage and head on the last push layers to the middle.
  const std::vector<layer_range> with_ends = split_layers_by_bytes(std::vector<size_t>(8, 100), 400, 400, 2);
  EXPECT_EQ(with_ends, (std::vector<layer_range>{{0, 4}, {4, 8}}));
  const std::vector<layer_range> heavy_head = split_layers_by_bytes(std::vector<size_t>(8, 100), 0, 400, 2);
  EXPECT_EQ(heavy_head, (std::vector<layer_range>{{0, 6}, {6, 8}}));
  // Every stage gets a layer, even when one layer outweighs the rest.
  const std::vector<layer_range> lopsided = split_layers_by_bytes({1000, 1, 1, 1}, 0, 0, 4);
  EXPECT_EQ(lopsided, (std::vector<layer_range>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  check_pipeline_ranges(lopsided, 4);
  // stories260K's bytes (f32: a layer, the embedding, the tied head with the final norm) in three
  // stages: a split that fills the first stages to their share first would give the middle one
  // three layers (545,280 bytes); the best puts at most 494,592 bytes on any stage.
  EXPECT_EQ(split_layers_by_bytes(std::vector<size_t>(5, 181760), 131072, 131328, 3),
            (std::vector<layer_range>{{0, 2}, {2, 4}, {4, 5}}));
  // Stages of unequal room are filled in proportion: a node with three times the memory takes
  // three times the layers.
  EXPECT_EQ(split_layers_by_capacity(std::vector<size_t>(8, 100), 0, 0, {1.0, 3.0}),
            (std::vector<layer_range>{{0, 2}, {2, 8}}));
  EXPECT_EQ(split_layers_by_capacity(std::vector<size_t>(8, 100), 0, 0, {1.0, 1.0}),
            split_layers_by_bytes(std::vector<size_t>(8, 100), 0, 0, 2));
  EXPECT_NE(error_of([] {
              split_layers_by_capacity({1, 2}, 0, 0, {1.0, 0.0});
            }).find("capacity must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              split_layers_by_bytes({1, 2}, 0, 0, 3);
            }).find("cannot split 2 layers into 3"),
            std::string::npos);
}

TEST(layer_range, a_stage_reads_its_layers_and_its_end_of_the_model) {
  model_config c;
  c.arch = architecture::llama;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 4;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  c.tie_word_embeddings = false;
  const model_tensor_names names = tensor_names(c);
  auto has = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  const std::vector<std::string> first = stage_tensor_names(c, {0, 2});
  const std::vector<std::string> last = stage_tensor_names(c, {2, 4});
  EXPECT_TRUE(has(first, names.embed_tokens));
  EXPECT_TRUE(has(first, names.layers[1].o_proj));
  EXPECT_FALSE(has(first, names.layers[2].o_proj));
  EXPECT_FALSE(has(first, names.lm_head));
  EXPECT_FALSE(has(last, names.embed_tokens));
  EXPECT_TRUE(has(last, names.layers[2].o_proj));
  EXPECT_TRUE(has(last, names.lm_head));
  EXPECT_TRUE(has(last, names.final_norm));
  EXPECT_EQ(first.size() + last.size(), expected_tensors(c).size());
  c.tie_word_embeddings = true;
  EXPECT_TRUE(has(stage_tensor_names(c, {2, 4}), tensor_names(c).embed_tokens));  // the tied head
  EXPECT_THROW(stage_tensor_names(c, {2, 5}), std::runtime_error);
}

}  // namespace
}  // namespace troupe
