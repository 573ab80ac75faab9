// The engine end to end on a model whose predictions depend on every KV slot it reads, so any
// slip in batching, block tables, prefix sharing or recomputation shows up in the tokens.

#include "engine/llm_engine.hpp"

#include <gtest/gtest.h>

#include <map>

#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::greedy;
using testing::kv_echo_model;

constexpr int vocab = 97;

std::vector<int32_t> reference(std::vector<int32_t> tokens, int max_tokens) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    int32_t next = kv_echo_model::next_token(tokens, vocab);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

struct engine_run {
  std::map<int64_t, std::vector<int32_t>> outputs;
  std::map<int64_t, token_delta> finals;
};

engine_run run(llm_engine& engine) {
  engine_run r;
  for (int i = 0; i < 20000 && engine.has_unfinished(); ++i) {
    for (auto& out : engine.step()) {
      auto& ids = r.outputs[out.request_id];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
      if (out.finished()) r.finals[out.request_id] = out;
    }
  }
  EXPECT_FALSE(engine.has_unfinished());
  return r;
}

std::unique_ptr<kv_echo_model> echo_model(int num_blocks, int block_size, kv_echo_model** raw) {
  auto m = std::make_unique<kv_echo_model>(num_blocks, block_size, vocab);
  *raw = m.get();
  return m;
}

TEST(llm_engine, many_requests_tiny_pool_small_budget_match_the_reference) {
  kv_echo_model* raw = nullptr;
  engine_config config;
  config.block_size = 4;
  config.max_num_batched_tokens = 6;  // smaller than most prompts: chunked prefill
  config.max_num_seqs = 8;
  auto m = echo_model(/*num_blocks=*/16, 4, &raw);
  llm_engine engine(std::move(m), config, std::nullopt, /*sampler_seed=*/1);
  EXPECT_EQ(engine.config().num_kv_blocks, 16);

  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lengths;
  for (int i = 0; i < 12; ++i) {
    // Pairs share a 9-token prefix so the prefix cache has something to find.
    std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    for (int j = 0; j < 1 + i % 7; ++j) prompt.push_back(20 + (i / 2) * 3 + j);
    prompts.push_back(prompt);
    lengths.push_back(5 + (i * 7) % 30);
    auto added = engine.add_request(prompt, greedy(lengths.back()), i % 2);
    ASSERT_TRUE(added.ok()) << added.error->message;
    EXPECT_EQ(added.request_id, i);
  }
  engine_run r = run(engine);
  int preemptions = 0, cached = 0;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(r.outputs[i], reference(prompts[i], lengths[i])) << "request " << i;
    ASSERT_TRUE(r.finals[i].metrics.has_value());
    const request_metrics& m = *r.finals[i].metrics;
    EXPECT_EQ(r.finals[i].finish, finish_reason::length);
    EXPECT_EQ(m.num_output_tokens, lengths[i]);
    EXPECT_LE(m.ttft, m.e2e);
    EXPECT_LE(m.queue_time, m.ttft);
    EXPECT_GE(m.tpot, 0.0);
    preemptions += m.num_preemptions;
    cached += m.num_cached_tokens;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(cached, 0);
  EXPECT_LE(raw->max_batch_tokens, 6);
  EXPECT_EQ(engine.get_scheduler().num_free_blocks(), 16);
}

TEST(llm_engine, abort_returns_a_final_output_and_frees_blocks) {
  kv_echo_model* raw = nullptr;
  engine_config config;
  config.block_size = 4;
  llm_engine engine(echo_model(32, 4, &raw), config, std::nullopt, 1);
  auto a = engine.add_request({5, 6, 7}, greedy(50));
  auto b = engine.add_request({5, 6, 8}, greedy(3));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> first_b;
  for (int i = 0; i < 2; ++i) {
    for (auto& out : engine.step()) {
      if (out.request_id == b.request_id) first_b.insert(first_b.end(), out.token_ids.begin(), out.token_ids.end());
    }
  }
  EXPECT_LT(engine.get_scheduler().num_free_blocks(), 32);
  EXPECT_TRUE(engine.abort(a.request_id));
  EXPECT_FALSE(engine.abort(12345));
  engine_run r = run(engine);
  EXPECT_EQ(r.finals[a.request_id].finish, finish_reason::abort);
  EXPECT_EQ(r.finals[b.request_id].finish, finish_reason::length);
  first_b.insert(first_b.end(), r.outputs[b.request_id].begin(), r.outputs[b.request_id].end());
  EXPECT_EQ(first_b, reference({5, 6, 8}, 3));
  EXPECT_EQ(engine.get_scheduler().num_free_blocks(), 32);
}

TEST(llm_engine, refuses_bad_requests_with_a_reason) {
  kv_echo_model* raw = nullptr;
  engine_config config;
  config.block_size = 4;
  config.max_waiting_requests = 1;
  llm_engine engine(echo_model(8, 4, &raw), config, std::nullopt, 1);
  auto out_of_vocab = engine.add_request({5, vocab}, greedy(2));
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_EQ(out_of_vocab.error->code, error_code::bad_request);
  ASSERT_TRUE(engine.add_request({5, 6}, greedy(2)).ok());
  auto full = engine.add_request({5, 6}, greedy(2));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error->code, error_code::overloaded);
  run(engine);
}

TEST(llm_engine, block_size_must_match_the_model) {
  kv_echo_model* raw = nullptr;
  engine_config config;
  config.block_size = 16;
  EXPECT_THROW(llm_engine(echo_model(8, 4, &raw), config), std::runtime_error);
  config.block_size = 4;
  config.num_kv_blocks = 9;
  EXPECT_THROW(llm_engine(echo_model(8, 4, &raw), config), std::runtime_error);
}

TEST(model_runner, flattens_a_plan_into_one_varlen_batch) {
  step_plan plan;
  scheduled_sequence a;
  a.request_id = 1;
  a.num_computed_tokens = 0;
  a.new_token_ids = {1, 2, 3};
  a.block_table = {7, 2};
  a.sample = false;
  scheduled_sequence b;
  b.request_id = 2;
  b.num_computed_tokens = 5;
  b.new_token_ids = {9};
  b.block_table = {4, 3, 0};  // the last block is beyond the 6 tokens: not sent
  b.sample = true;
  plan.sequences = {a, b};
  forward_batch batch;
  model_runner::build_batch(plan, 4, batch);
  EXPECT_EQ(batch.token_ids, (std::vector<int32_t>{1, 2, 3, 9}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 5}));
  EXPECT_EQ(batch.slot_mapping, (std::vector<int64_t>{28, 29, 30, 13}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(batch.context_lengths, (std::vector<int32_t>{3, 6}));
  EXPECT_EQ(batch.block_table_start, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(batch.block_tables, (std::vector<int32_t>{7, 4, 3}));
  EXPECT_EQ(batch.logits_rows, (std::vector<int32_t>{3}));
  plan.sequences[1].block_table = {4};
  EXPECT_THROW(model_runner::build_batch(plan, 4, batch), std::runtime_error);
}

}  // namespace
}  // namespace troupe
