// Plans carry block tables as diffs: a sequence's first entry (or its first after preemption)
// sends the whole table, later entries only the blocks appended since, and the worker's
// model_runner keeps each table until a plan says the request ended. Checked from both sides:
// what the scheduler puts in its plans, and what the runner does with them.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "engine/model_runner.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::kv_echo_model;
using testing::make_prompt;

TEST(block_table_diff, decode_entries_send_only_the_blocks_appended_since_the_last_plan) {
  auto sched = create_scheduler(64, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), greedy(20)));
  std::vector<int32_t> worker_table;  // what a worker rebuilds from the diffs
  for (int step = 0; step < 12; ++step) {
    step_plan plan = sched->schedule();
    ASSERT_EQ(plan.sequences.size(), 1u);
    const scheduled_sequence& s = plan.sequences[0];
    if (step == 0) {
      EXPECT_EQ(s.block_table_start, 0);
    }
    ASSERT_EQ(s.block_table_start, static_cast<int>(worker_table.size())) << "step " << step;
    worker_table.insert(worker_table.end(), s.block_table.begin(), s.block_table.end());
    // Only a step that crosses into a new block sends one.
    EXPECT_LE(s.block_table.size(), step == 0 ? 2u : 1u) << "step " << step;
    EXPECT_EQ(worker_table, sched->find(1)->blocks().block_ids) << "step " << step;
    sched->update(plan, fake_run(plan));
  }
}

TEST(block_table_diff, finished_requests_are_named_in_the_next_plan_once) {
  auto sched = create_scheduler(64, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(5), greedy(1)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(5, 40), greedy(5)));
  step_plan first = sched->schedule();
  EXPECT_TRUE(first.finished_ids.empty());
  sched->update(first, fake_run(first));  // request 1 is done after one token
  ASSERT_FALSE(sched->add_request(3, make_prompt(5, 70), greedy(5)));
  ASSERT_TRUE(sched->abort(3));  // before any plan named it
  step_plan second = sched->schedule();
  EXPECT_EQ(second.finished_ids, (std::vector<int64_t>{1}));  // 3 never reached the worker
  sched->update(second, fake_run(second));
  step_plan third = sched->schedule();
  EXPECT_TRUE(third.finished_ids.empty());
}

TEST(block_table_diff, a_preempted_sequence_comes_back_with_its_whole_table) {
  // 6 blocks of 4 tokens: two sequences of 8-token prompts outgrow the pool and one is preempted.
  auto sched = create_scheduler(6, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(8), greedy(12)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(8, 40), greedy(12)));
  bool saw_readmission = false;
  std::set<int64_t> preempted;
  for (int step = 0; step < 60 && sched->has_unfinished(); ++step) {
    step_plan plan = sched->schedule();
    for (int64_t id : plan.preempted_ids) preempted.insert(id);
    for (const scheduled_sequence& s : plan.sequences) {
      if (preempted.erase(s.request_id)) {
        EXPECT_EQ(s.block_table_start, 0) << "request " << s.request_id;
        EXPECT_EQ(s.block_table, sched->find(s.request_id)->blocks().block_ids);
        saw_readmission = true;
      }
    }
    sched->update(plan, fake_run(plan));
  }
  EXPECT_TRUE(saw_readmission);
  EXPECT_FALSE(sched->has_unfinished());
}

TEST(block_table_diff, the_runner_keeps_tables_until_the_request_ends_and_checks_each_diff) {
  kv_echo_model m(16, 4, 32);
  model_runner runner(m, 1);
  step_plan prefill;
  prefill.step_id = 0;
  scheduled_sequence s;
  s.request_id = 5;
  s.new_token_ids = {3, 4, 5, 6};
  s.block_table = {9};
  s.sample = true;
  s.params = greedy(8);
  prefill.sequences = {s};
  const int32_t first = runner.run(prefill).tokens.at(0).token_id;
  EXPECT_EQ(runner.num_requests_held(), 1u);

  // The fifth token needs a second block: only that block is sent.
  step_plan decode;
  decode.step_id = 1;
  s.num_computed_tokens = 4;
  s.new_token_ids = {first};
  s.block_table_start = 1;
  s.block_table = {2};
  decode.sequences = {s};
  runner.run(decode);
  EXPECT_EQ(runner.last_batch().block_tables, (std::vector<int32_t>{9, 2}));

  // A diff that does not continue the table the runner holds is refused by name.
  step_plan wrong = decode;
  wrong.step_id = 2;
  wrong.sequences[0].num_computed_tokens = 5;
  wrong.sequences[0].block_table_start = 1;
  wrong.sequences[0].block_table = {};
  try {
    runner.run(wrong);
    FAIL() << "a diff from the wrong block was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("request 5"), std::string::npos) << e.what();
  }

  // A plan naming the request as finished drops its table, so a later diff for it fails too.
  step_plan ended;
  ended.step_id = 3;
  ended.finished_ids = {5};
  runner.run(ended);
  EXPECT_EQ(runner.num_requests_held(), 0u);
  wrong.step_id = 4;
  wrong.sequences[0].block_table_start = 2;
  EXPECT_THROW(runner.run(wrong), std::runtime_error);
}

TEST(block_table_diff, the_runner_keeps_the_sampling_params_from_the_entry_that_starts_a_request) {
  kv_echo_model m(16, 4, 32);
  model_runner runner(m, 1);
  scheduled_sequence s;
  s.request_id = 7;
  s.new_token_ids = {3, 4, 5};
  s.block_table = {1};
  s.sample = true;
  s.params = greedy(8);
  s.params->logprobs = 2;  // visible in every result the runner samples with these params
  step_plan prefill;
  prefill.sequences = {s};
  const sampled_token first = runner.run(prefill).tokens.at(0);
  EXPECT_EQ(first.top_token_ids.size(), 2u);

  // A decode entry carries no params: the runner samples with the ones it kept.
  step_plan decode;
  decode.step_id = 1;
  s.num_computed_tokens = 3;
  s.new_token_ids = {first.token_id};
  s.block_table_start = 1;
  s.block_table = {};
  s.output_index = 1;
  s.params.reset();
  decode.sequences = {s};
  const sampled_token second = runner.run(decode).tokens.at(0);
  EXPECT_EQ(second.top_token_ids.size(), 2u);
  EXPECT_EQ(second.token_id, kv_echo_model::next_token({3, 4, 5, first.token_id}, 32));

  // An entry that starts a request on the worker must bring them.
  step_plan bare;
  bare.step_id = 2;
  scheduled_sequence fresh;
  fresh.request_id = 8;
  fresh.new_token_ids = {3};
  fresh.block_table = {2};
  fresh.sample = true;
  bare.sequences = {fresh};
  try {
    runner.run(bare);
    FAIL() << "a request started without sampling parameters was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("request 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sampling parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
