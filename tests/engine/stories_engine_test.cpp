// The engine on the real trained stories260K model reproduces the reference greedy
// continuations (refs.json) while juggling many requests in a KV pool too small for them all
// (preemption and recompute) under a token budget smaller than a prompt (chunked prefill).

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "backends/cpu/cpu_model.hpp"
#include "engine/llm_engine.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/shared_models.hpp"
#include "tests/stories_references.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_dir = std::filesystem::path(TROUPE_SHARED_DIR) / "models" / "stories260K";

struct stories_case {
  const char* name;
  const char* source;  // relative to stories_dir
  int block_size;
  int num_blocks;
  int max_num_batched_tokens;
  int max_num_seqs;
  bool prefix_caching;
};

class stories_engine : public ::testing::TestWithParam<stories_case> {};

TEST_P(stories_engine, reproduces_reference_continuations) {
  const stories_case& c = GetParam();
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir / "refs.json");
  loaded_model loaded =
      load_model(load_options{stories_dir / c.source, load_format::auto_detect, dtype::f32, 0, false});
  auto m = make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{c.num_blocks, c.block_size}, 1);
  engine_config config;
  config.block_size = c.block_size;
  config.num_kv_blocks = c.num_blocks;
  config.max_num_batched_tokens = c.max_num_batched_tokens;
  config.max_num_seqs = c.max_num_seqs;
  config.enable_prefix_caching = c.prefix_caching;
  llm_engine engine(std::move(m), config, std::nullopt, 1);

  const auto& refs = test::stories_references();
  ASSERT_EQ(refs.size(), 3u);
  // Every reference prompt three times with different lengths, interleaved.
  std::map<int64_t, std::pair<size_t, int>> wanted;  // request -> (reference, max_tokens)
  for (int round = 0; round < 3; ++round) {
    for (size_t r = 0; r < refs.size(); ++r) {
      sampling_params p;
      p.temperature = 0.0f;
      p.max_tokens = 60 - 17 * round - static_cast<int>(r) * 3;
      p.ignore_eos = true;  // the references run to their length
      auto added = engine.add_request(refs[r].input_ids, p, 0);
      ASSERT_TRUE(added.ok()) << added.error->message;
      wanted[added.request_id] = {r, p.max_tokens};
    }
  }
  std::map<int64_t, std::vector<int32_t>> outputs;
  int preemptions = 0;
  int steps = 0;
  while (engine.has_unfinished() && steps++ < 5000) {
    for (const auto& out : engine.step()) {
      auto& ids = outputs[out.request_id];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
      if (out.finished()) preemptions += out.metrics->num_preemptions;
    }
  }
  ASSERT_FALSE(engine.has_unfinished());
  for (const auto& [id, want] : wanted) {
    const auto& ref = refs[want.first].generated_ids;
    std::vector<int32_t> expected(ref.begin(), ref.begin() + want.second);
    EXPECT_EQ(outputs[id], expected) << "request " << id << " (reference " << want.first << ")";
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small";
  EXPECT_EQ(engine.get_scheduler().num_free_blocks(), c.num_blocks);
}

INSTANTIATE_TEST_SUITE_P(pools, stories_engine,
                         ::testing::Values(
                             // Budget 3 < every prompt: prompts are cut into chunks. 9 sequences of up to 65 tokens
                             // in 40 blocks of 4: preemption.
                             stories_case{"hf_chunked", "hf", 4, 40, 3, 16, true},
                             stories_case{"hf_no_prefix_cache", "hf", 4, 40, 3, 16, false},
                             stories_case{"hf_blocks16", "hf", 16, 12, 64, 16, true},
                             stories_case{"gguf", "gguf/stories260K-f32.gguf", 8, 20, 4, 16, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace troupe
