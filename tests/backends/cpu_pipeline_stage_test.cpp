// Pipeline stages on the CPU backend (issue 27, first step): stories260K cut into 2 and 3 stages,
// each loaded with only its tensors, the residual stream handed from stage to stage, gives the
// whole model's logits bitwise over a prefill and decode steps of two sequences; a stage
// refuses a batch that does not fit its place in the pipeline, and KV moves per stage.

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "model/layer_range.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_tensors.hpp"
#include "tests/backends/kv_transfer_support.hpp"
#include "tests/backends/pipeline_stage_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

constexpr int block_size = 4;
constexpr int num_blocks = 16;

using stage = test::loaded_stage;

// Two sequences in one batch: A's tokens [a_computed, a.size()), B's [b_computed, b.size()), A in
// blocks 0-7 and B in 8-15; the logits of each sequence's last token.
forward_batch two_sequence_batch(const std::vector<int32_t>& a, int a_computed, const std::vector<int32_t>& b,
                                 int b_computed) {
  forward_batch batch;
  batch.query_start.push_back(0);
  batch.block_table_start.push_back(0);
  auto add = [&](const std::vector<int32_t>& tokens, int computed, int first_block) {
    for (int t = computed; t < static_cast<int>(tokens.size()); ++t) {
      batch.token_ids.push_back(tokens[static_cast<size_t>(t)]);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back(int64_t{first_block + t / block_size} * block_size + t % block_size);
    }
    batch.query_start.push_back(batch.num_tokens());
    batch.context_lengths.push_back(static_cast<int32_t>(tokens.size()));
    for (int i = 0; i < 8; ++i) batch.block_tables.push_back(first_block + i);
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
    batch.logits_rows.push_back(batch.num_tokens() - 1);
  };
  add(a, a_computed, 0);
  add(b, b_computed, 8);
  return batch;
}

// Runs `batch` through the stages in order, handing the residual stream on; the last stage's
// logits [num_logits, vocab].
std::vector<float> run_pipeline(std::vector<stage>& stages, forward_batch batch, int hidden, int vocab) {
  const std::vector<int32_t> logits_rows = batch.logits_rows;
  std::vector<float> stream_in, stream_out;  // [num_tokens, hidden] each
  std::vector<float> logits(logits_rows.size() * static_cast<size_t>(vocab));
  for (size_t s = 0; s < stages.size(); ++s) {
    const bool last = s + 1 == stages.size();
    batch.residual_in = s == 0 ? nullptr : stream_in.data();
    stream_out.assign(static_cast<size_t>(batch.num_tokens()) * hidden, 0.0f);
    batch.residual_out = last ? nullptr : stream_out.data();
    batch.logits_rows = last ? logits_rows : std::vector<int32_t>{};
    stages[s].m->forward(batch, logits.data());
    std::swap(stream_in, stream_out);
  }
  return logits;
}

// Prefill of two prompts then `steps` greedy decode steps of both, every step's logits.
std::vector<std::vector<float>> generate(std::vector<stage>& stages, int steps) {
  const model_config& c = stages.back().m->config();
  std::vector<int32_t> a = test::kv_transfer_prompt;
  std::vector<int32_t> b = {1, 365, 322, 403, 261, 378};
  int a_done = 0, b_done = 0;
  std::vector<std::vector<float>> all;
  for (int step = 0; step <= steps; ++step) {
    std::vector<float> logits =
        run_pipeline(stages, two_sequence_batch(a, a_done, b, b_done), c.hidden_size, c.vocab_size);
    a_done = static_cast<int>(a.size());
    b_done = static_cast<int>(b.size());
    a.push_back(test::argmax(logits.data(), c.vocab_size));
    b.push_back(test::argmax(logits.data() + c.vocab_size, c.vocab_size));
    all.push_back(std::move(logits));
  }
  return all;
}

std::vector<stage> load_pipeline(const std::string& path, const std::vector<layer_range>& ranges) {
  std::vector<stage> stages;
  for (const layer_range& r : ranges) stages.push_back(test::load_stage(path, r, {num_blocks, block_size}));
  return stages;
}

class cpu_pipeline_stage : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf"); }
  std::string path() const {
    return GetParam() == "hf" ? (test::stories260k_dir / "hf").string()
                              : (test::stories260k_dir / "gguf" / "stories260K-f32.gguf").string();
  }
};

TEST_P(cpu_pipeline_stage, two_and_three_stages_give_the_whole_models_logits_bitwise) {
  std::vector<stage> whole = load_pipeline(path(), {layer_range{}});
  const std::vector<std::vector<float>> expected = generate(whole, 6);
  std::vector<stage> two = load_pipeline(path(), {{0, 2}, {2, 5}});
  EXPECT_EQ(generate(two, 6), expected);
  std::vector<stage> three = load_pipeline(path(), {{0, 1}, {1, 3}, {3, 5}});
  EXPECT_EQ(generate(three, 6), expected);
}

TEST_P(cpu_pipeline_stage, a_stage_skipped_changes_the_logits) {
  // The control: two stages that leave out layer 2 do not give the whole model's logits, so the
  // equality above needs every stage's layers.
  std::vector<stage> whole = load_pipeline(path(), {layer_range{}});
  std::vector<stage> gap = load_pipeline(path(), {{0, 2}, {3, 5}});
  EXPECT_NE(generate(gap, 2), generate(whole, 2));
}

TEST_P(cpu_pipeline_stage, each_stage_keeps_only_its_tensors) {
  std::vector<stage> stages = load_pipeline(path(), {{0, 1}, {1, 3}, {3, 5}});
  const model_config& c = stages[0].loaded->config;
  const model_tensor_names names = tensor_names(c);
  const weight_store& first = stages[0].loaded->weights;
  const weight_store& middle = stages[1].loaded->weights;
  const weight_store& last = stages[2].loaded->weights;
  EXPECT_TRUE(first.contains(names.embed_tokens));
  EXPECT_TRUE(first.contains(names.layers[0].q_proj));
  EXPECT_FALSE(first.contains(names.layers[1].q_proj));
  EXPECT_FALSE(first.contains(names.final_norm));
  EXPECT_FALSE(middle.contains(names.embed_tokens));
  EXPECT_FALSE(middle.contains(names.layers[0].q_proj));
  EXPECT_TRUE(middle.contains(names.layers[2].down_proj));
  EXPECT_FALSE(middle.contains(names.layers[3].q_proj));
  EXPECT_FALSE(middle.contains(names.final_norm));
  EXPECT_TRUE(last.contains(names.final_norm));
  EXPECT_TRUE(last.contains(names.lm_head));  // tied: the embedding, read as the output projection
  EXPECT_FALSE(last.contains(names.layers[2].q_proj));
  EXPECT_LT(middle.total_bytes(), stages[0].loaded->weights.total_bytes() + last.total_bytes());
}

TEST_P(cpu_pipeline_stage, a_batch_that_does_not_fit_the_stage_is_refused_by_name) {
  std::vector<stage> stages = load_pipeline(path(), {{0, 2}, {2, 5}});
  const model_config& c = stages[0].m->config();
  forward_batch batch = two_sequence_batch(test::kv_transfer_prompt, 0, {1, 365}, 0);
  std::vector<float> stream(static_cast<size_t>(batch.num_tokens()) * c.hidden_size);
  std::vector<float> logits(2 * static_cast<size_t>(c.vocab_size));
  auto refusal = [&](model& m, const forward_batch& b) -> std::string {
    try {
      m.forward(b, logits.data());
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  // The first stage asked for logits, or without a place for its output.
  batch.residual_out = stream.data();
  EXPECT_NE(refusal(*stages[0].m, batch).find("only the last stage"), std::string::npos);
  batch.residual_out = nullptr;
  batch.logits_rows.clear();
  EXPECT_NE(refusal(*stages[0].m, batch).find("needs residual_out"), std::string::npos);
  // The last stage without the first one's output.
  batch.logits_rows = {batch.num_tokens() - 1};
  EXPECT_NE(refusal(*stages[1].m, batch).find("needs residual_in"), std::string::npos);
}

TEST_P(cpu_pipeline_stage, kv_moves_stage_by_stage) {
  // A whole model's KV, exported per stage's layers, continues in a 2-stage pipeline as in the
  // whole model (how a pipelined decode instance receives a prefill's KV); layers of another
  // stage are refused.
  std::vector<stage> whole = load_pipeline(path(), {layer_range{}});
  std::vector<stage> two = load_pipeline(path(), {{0, 2}, {2, 5}});
  const std::vector<int32_t> blocks = {0, 1, 2};
  const int32_t next = test::prefill(*whole[0].m, test::kv_transfer_prompt, blocks);
  const std::vector<float> expected = test::decode_logits(*whole[0].m, test::kv_transfer_prompt, next, blocks);
  test::move_kv(*whole[0].m, blocks, *two[0].m, blocks, 0, 2, dtype::f32);
  test::move_kv(*whole[0].m, blocks, *two[1].m, blocks, 2, 3, dtype::f32);
  std::vector<int32_t> tokens = test::kv_transfer_prompt;
  const int computed = static_cast<int>(tokens.size());
  tokens.push_back(next);
  forward_batch step = test::one_sequence_batch(tokens, computed, computed + 1, blocks, block_size);
  const model_config& c = whole[0].m->config();
  EXPECT_EQ(run_pipeline(two, step, c.hidden_size, c.vocab_size), expected);
  EXPECT_THROW(test::move_kv(*whole[0].m, blocks, *two[0].m, blocks, 1, 2, dtype::f32), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(formats, cpu_pipeline_stage, ::testing::Values("hf", "gguf"));

}  // namespace
}  // namespace troupe
