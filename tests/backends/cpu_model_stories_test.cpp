// The trained stories260K model on the CPU backend reproduces llama2.c's greedy continuations
// (refs.json) token for token, loaded from the HF directory and from the GGUF file, and its
// first-step logits match the README's top-5 values.

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/simd_level.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/backends/cpu_test_support.hpp"
#include "tests/stories_references.hpp"

namespace troupe {
namespace {

const std::string stories_dir = std::string(TROUPE_SHARED_DIR) + "/models/stories260K";

void expect_reference_continuations(const std::string& path) {
  const loaded_model loaded = load_model(load_options{path});
  const auto& refs = test::stories_references();
  ASSERT_EQ(refs.size(), 3u);
  for (cpu::simd_level level : test::supported_simd_levels()) {
    test::scoped_simd_level force(level);
    auto m = make_cpu_model(loaded.config, loaded.weights, {32, 4}, 2);
    for (const test::stories_reference& ref : refs) {
      // Blocks in reverse order, so that the block table really is followed.
      std::vector<int32_t> blocks(32);
      std::iota(blocks.rbegin(), blocks.rend(), 0);
      const auto result = test::greedy_generate(*m, ref.input_ids, static_cast<int>(ref.generated_ids.size()), blocks);
      EXPECT_EQ(result.generated, ref.generated_ids)
          << path << ", prompt \"" << ref.prompt << "\", " << cpu::simd_level_name(level);
    }
  }
}

TEST(cpu_model_stories, hf_greedy_matches_references) { expect_reference_continuations(stories_dir + "/hf"); }

TEST(cpu_model_stories, gguf_greedy_matches_references) {
  expect_reference_continuations(stories_dir + "/gguf/stories260K-f32.gguf");
}

TEST(cpu_model_stories, first_step_logits_match_readme_top5) {
  for (const std::string& path : {stories_dir + "/hf", stories_dir + "/gguf/stories260K-f32.gguf"}) {
    const loaded_model loaded = load_model(load_options{path});
    // The README's logits come from an f32 forward pass; an f16 cache moves them by ~1e-3.
    auto m = make_cpu_model(loaded.config, loaded.weights, {8, 16}, 2, dtype::f32);
    const auto result = test::greedy_generate(*m, {1, 403, 407, 261, 378}, 1);  // "Once upon a time"
    const std::vector<std::pair<int, float>> top5 = {
        {432, 17.7994f}, {383, 14.2813f}, {322, 9.7097f}, {353, 9.5873f}, {323, 9.1342f}};
    std::vector<int> order(result.first_logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int a, int b) { return result.first_logits[a] > result.first_logits[b]; });
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(order[i], top5[i].first) << path << " rank " << i;
      EXPECT_NEAR(result.first_logits[top5[i].first], top5[i].second, 1e-3) << path << " token " << top5[i].first;
    }
  }
}

TEST(cpu_model_stories, kv_budget_and_bad_batches) {
  const loaded_model loaded = load_model(load_options{stories_dir + "/hf"});
  // 5 layers x K,V x 16 tokens x 4 kv heads x 8 dims x 4 bytes = 20480 bytes a block in f32;
  // half in f16 (the default), a quarter in fp8.
  EXPECT_EQ(cpu_kv_blocks_for_budget(loaded.config, 20480 * 10 + 5, 16, dtype::f32), 10);
  EXPECT_EQ(cpu_kv_blocks_for_budget(loaded.config, 20480 * 10 + 5, 16), 20);
  EXPECT_EQ(cpu_kv_blocks_for_budget(loaded.config, 20480 * 10 + 5, 16, dtype::fp8_e4m3), 40);
  auto m = make_cpu_model(loaded.config, loaded.weights, {4, 16}, 1);
  EXPECT_EQ(m->kv_shape().num_blocks, 4);
  forward_batch batch;
  batch.token_ids = {1, 600};
  batch.positions = {0, 1};
  batch.slot_mapping = {0, 1};
  batch.query_start = {0, 2};
  batch.context_lengths = {2};
  batch.block_table_start = {0, 1};
  batch.block_tables = {0};
  batch.logits_rows = {1};
  std::vector<float> logits(loaded.config.vocab_size);
  EXPECT_THROW(m->forward(batch, logits.data()), std::runtime_error);  // token 600 >= vocab 512
  batch.token_ids[1] = 5;
  batch.block_tables = {4};  // outside the pool
  EXPECT_THROW(m->forward(batch, logits.data()), std::runtime_error);
  batch.block_tables = {3};
  EXPECT_NO_THROW(m->forward(batch, logits.data()));
}

}  // namespace
}  // namespace troupe
