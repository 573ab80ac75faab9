#include "engine/scheduler.hpp"

#include <gtest/gtest.h>

#include <map>

#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::make_prompt;

// Runs the scheduler to completion with fake tokens; returns every request's output ids.
using output_map = std::map<int64_t, std::vector<int32_t>>;

void collect(output_map& outputs, const std::vector<token_delta>& deltas) {
  for (const auto& d : deltas) {
    auto& out = outputs[d.request_id];
    out.insert(out.end(), d.token_ids.begin(), d.token_ids.end());
  }
}

output_map run_to_end(scheduler& s, output_map outputs = {}, int max_steps = 10000) {
  for (int step = 0; step < max_steps && s.has_unfinished(); ++step) {
    step_plan plan = s.schedule();
    EXPECT_LE(plan.num_tokens(), s.config().max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(plan.sequences.size()), s.config().max_num_seqs);
    collect(outputs, s.update(plan, fake_run(plan)));
  }
  EXPECT_FALSE(s.has_unfinished());
  return outputs;
}

std::vector<int32_t> expected_outputs(int n) {
  std::vector<int32_t> ids;
  for (int k = 0; k < n; ++k) ids.push_back(1000 + k);
  return ids;
}

TEST(scheduler, chunked_prefill_splits_a_long_prompt_under_the_budget) {
  auto s = create_scheduler(64, 16, /*max_num_batched_tokens=*/16);
  ASSERT_FALSE(s->add_request(7, make_prompt(50), greedy(3)));
  std::vector<int> chunks;
  for (int i = 0; i < 4; ++i) {
    step_plan plan = s->schedule();
    ASSERT_EQ(plan.sequences.size(), 1u);
    const auto& entry = plan.sequences[0];
    EXPECT_EQ(entry.num_computed_tokens, i * 16);
    EXPECT_EQ(entry.sample, i == 3);  // only the chunk reaching the last prompt token samples
    EXPECT_EQ(entry.new_token_ids.front(), 10 + i * 16);
    chunks.push_back(entry.num_new_tokens());
    auto deltas = s->update(plan, fake_run(plan));
    EXPECT_EQ(deltas.size(), i == 3 ? 1u : 0u);
  }
  EXPECT_EQ(chunks, (std::vector<int>{16, 16, 16, 2}));
  EXPECT_EQ(s->find(7)->num_computed_tokens(), 50);
  auto outputs = run_to_end(*s);
  EXPECT_EQ(outputs[7], (std::vector<int32_t>{1001, 1002}));
  EXPECT_EQ(s->num_free_blocks(), 64);
}

TEST(scheduler, prefill_chunk_rides_with_decodes_and_budget_is_shared) {
  auto s = create_scheduler(64, 16, /*max_num_batched_tokens=*/10);
  ASSERT_FALSE(s->add_request(1, make_prompt(4), greedy(20)));
  ASSERT_FALSE(s->add_request(2, make_prompt(4, 50), greedy(20)));
  step_plan first = s->schedule();
  ASSERT_EQ(first.sequences.size(), 2u);
  EXPECT_EQ(first.num_tokens(), 8);
  output_map outputs;
  collect(outputs, s->update(first, fake_run(first)));
  ASSERT_FALSE(s->add_request(3, make_prompt(30, 100), greedy(5)));
  step_plan mixed = s->schedule();
  ASSERT_EQ(mixed.sequences.size(), 3u);
  EXPECT_EQ(mixed.sequences[0].num_new_tokens(), 1);  // decodes first
  EXPECT_EQ(mixed.sequences[1].num_new_tokens(), 1);
  EXPECT_EQ(mixed.sequences[2].num_new_tokens(), 8);  // the rest of the budget
  EXPECT_FALSE(mixed.sequences[2].sample);
  collect(outputs, s->update(mixed, fake_run(mixed)));
  outputs = run_to_end(*s, outputs);
  EXPECT_EQ(outputs[1], expected_outputs(20));
  EXPECT_EQ(outputs[3], expected_outputs(5));
  EXPECT_EQ(s->num_free_blocks(), 64);
}

TEST(scheduler, max_num_seqs_caps_a_step) {
  auto s = create_scheduler(64, 4, 8192, /*max_num_seqs=*/3);
  for (int i = 0; i < 7; ++i) ASSERT_FALSE(s->add_request(i, make_prompt(5, 10 * i), greedy(4)));
  step_plan plan = s->schedule();
  EXPECT_EQ(plan.sequences.size(), 3u);
  EXPECT_EQ(s->num_running(), 3);
  EXPECT_EQ(s->num_waiting(), 4);
  output_map outputs;
  collect(outputs, s->update(plan, fake_run(plan)));
  outputs = run_to_end(*s, outputs);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(outputs[i], expected_outputs(4)) << i;
  EXPECT_EQ(s->num_free_blocks(), 64);
}

TEST(scheduler, preempts_newest_when_blocks_run_out_and_recomputes_it) {
  // 6 blocks of 4 tokens: two sequences growing to 4 + 12 = 16 tokens (4 blocks each) collide.
  auto s = create_scheduler(6, 4, 8192, 128, /*enable_prefix_caching=*/false);
  ASSERT_FALSE(s->add_request(1, make_prompt(4), greedy(12)));
  ASSERT_FALSE(s->add_request(2, make_prompt(4, 40), greedy(12)));
  bool saw_preemption = false;
  bool saw_recompute = false;
  std::map<int64_t, std::vector<int32_t>> outputs;
  while (s->has_unfinished()) {
    step_plan plan = s->schedule();
    for (int64_t id : plan.preempted_ids) {
      EXPECT_EQ(id, 2);  // the newest goes first
      saw_preemption = true;
      EXPECT_EQ(s->find(2)->status(), sequence_status::preempted);
      EXPECT_TRUE(s->find(2)->blocks().empty());
    }
    for (const auto& e : plan.sequences) {
      if (e.request_id == 2 && e.num_computed_tokens == 0 && e.num_new_tokens() > 4) {
        saw_recompute = true;  // prompt and the outputs so far, computed again
        EXPECT_EQ(e.new_token_ids[4], 1000);
      }
    }
    for (auto& d : s->update(plan, fake_run(plan))) {
      outputs[d.request_id].insert(outputs[d.request_id].end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  EXPECT_TRUE(saw_preemption);
  EXPECT_TRUE(saw_recompute);
  EXPECT_EQ(outputs[1], expected_outputs(12));
  EXPECT_EQ(outputs[2], expected_outputs(12));
  EXPECT_EQ(s->num_free_blocks(), 6);
}

TEST(scheduler, prefix_cache_hit_skips_computed_blocks_and_shares_them) {
  auto s = create_scheduler(32, 16);
  auto prompt = make_prompt(40);
  ASSERT_FALSE(s->add_request(1, prompt, greedy(8)));
  step_plan plan = s->schedule();
  output_map outputs;
  collect(outputs, s->update(plan, fake_run(plan)));
  ASSERT_FALSE(s->add_request(2, prompt, greedy(8)));
  plan = s->schedule();
  ASSERT_EQ(plan.sequences.size(), 2u);
  const auto& second = plan.sequences[1];
  EXPECT_EQ(second.num_computed_tokens, 32);  // two full blocks from the cache
  EXPECT_EQ(second.num_new_tokens(), 8);
  const auto& first_table = s->find(1)->blocks().block_ids;
  EXPECT_EQ(second.block_table[0], first_table[0]);
  EXPECT_EQ(second.block_table[1], first_table[1]);
  EXPECT_NE(second.block_table[2], first_table[2]);
  EXPECT_EQ(s->kv_cache().pool().ref_count(first_table[0]), 2);
  EXPECT_EQ(s->find(2)->metrics().num_cached_tokens, 32);
  collect(outputs, s->update(plan, fake_run(plan)));
  outputs = run_to_end(*s, outputs);
  EXPECT_EQ(outputs[1], expected_outputs(8));
  EXPECT_EQ(outputs[2], expected_outputs(8));
  EXPECT_EQ(s->num_free_blocks(), 32);
  EXPECT_GT(s->kv_cache().pool().num_cached_blocks(), 0);  // still cached after being freed
}

TEST(scheduler, abort_frees_blocks_at_once) {
  auto s = create_scheduler(16, 4);
  ASSERT_FALSE(s->add_request(1, make_prompt(10), greedy(30)));
  ASSERT_FALSE(s->add_request(2, make_prompt(3), greedy(30)));
  step_plan plan = s->schedule();
  s->update(plan, fake_run(plan));
  EXPECT_EQ(s->num_free_blocks(), 16 - 3 - 1);
  auto last = s->abort(1);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->finish, finish_reason::abort);
  ASSERT_TRUE(last->metrics.has_value());
  EXPECT_EQ(last->metrics->num_output_tokens, 1);
  EXPECT_EQ(s->num_free_blocks(), 16 - 1);
  EXPECT_EQ(s->find(1), nullptr);
  EXPECT_FALSE(s->abort(1).has_value());
  // A waiting request aborts too, and a plan made before the abort is applied harmlessly.
  ASSERT_FALSE(s->add_request(3, make_prompt(5), greedy(30)));
  plan = s->schedule();
  ASSERT_TRUE(s->abort(3).has_value());
  ASSERT_TRUE(s->abort(2).has_value());
  EXPECT_TRUE(s->update(plan, fake_run(plan)).empty());
  EXPECT_FALSE(s->has_unfinished());
  EXPECT_EQ(s->num_free_blocks(), 16);
}

TEST(scheduler, full_waiting_queue_answers_overloaded) {
  auto s = create_scheduler(16, 4, 8192, 128, true, /*max_waiting_requests=*/2);
  ASSERT_FALSE(s->add_request(1, make_prompt(3), greedy(2)));
  ASSERT_FALSE(s->add_request(2, make_prompt(3), greedy(2)));
  auto error = s->add_request(3, make_prompt(3), greedy(2));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code, error_code::overloaded);
  EXPECT_EQ(s->find(3), nullptr);
  step_plan plan = s->schedule();  // both admitted: the queue has room again
  s->update(plan, fake_run(plan));
  EXPECT_FALSE(s->add_request(3, make_prompt(3), greedy(2)));
  run_to_end(*s);
  EXPECT_EQ(s->num_free_blocks(), 16);
}

TEST(scheduler, refuses_requests_that_can_never_run) {
  auto s = create_scheduler(4, 4, 8192, 128, true, 1024, /*max_model_len=*/32);
  EXPECT_EQ(s->add_request(1, {}, greedy(2))->code, error_code::bad_request);
  EXPECT_EQ(s->add_request(2, make_prompt(32), greedy(2))->code, error_code::bad_request);
  EXPECT_EQ(s->add_request(3, make_prompt(10), greedy(10))->code, error_code::bad_request);  // > 4 blocks
  sampling_params bad = greedy(2);
  bad.top_p = 0.0f;
  EXPECT_EQ(s->add_request(4, make_prompt(3), bad)->code, error_code::bad_request);
  ASSERT_FALSE(s->add_request(5, make_prompt(3), greedy(2)));
  EXPECT_EQ(s->add_request(5, make_prompt(3), greedy(2))->code, error_code::duplicate_id);
  EXPECT_EQ(s->num_waiting(), 1);
}

TEST(scheduler, waiting_requests_are_admitted_by_priority_then_arrival) {
  auto s = create_scheduler(64, 4, 8192, /*max_num_seqs=*/1);
  ASSERT_FALSE(s->add_request(1, make_prompt(3), greedy(1), /*priority=*/5));
  ASSERT_FALSE(s->add_request(2, make_prompt(3), greedy(1), 0));
  ASSERT_FALSE(s->add_request(3, make_prompt(3), greedy(1), 5));
  ASSERT_FALSE(s->add_request(4, make_prompt(3), greedy(1), 0));
  std::vector<int64_t> order;
  while (s->has_unfinished()) {
    step_plan plan = s->schedule();
    for (const auto& e : plan.sequences) order.push_back(e.request_id);
    s->update(plan, fake_run(plan));
  }
  EXPECT_EQ(order, (std::vector<int64_t>{2, 4, 1, 3}));
}

TEST(scheduler, stops_on_eos_stop_ids_max_tokens_and_max_model_len) {
  auto s = create_scheduler(64, 4, 8192, 128, true, 1024, /*max_model_len=*/12);
  sampling_params eos = greedy(10, /*ignore_eos=*/false);
  sampling_params ignore = greedy(3, /*ignore_eos=*/true);
  sampling_params stop = greedy(10);
  stop.stop_token_ids = {1001};
  ASSERT_FALSE(s->add_request(1, make_prompt(3), eos));
  ASSERT_FALSE(s->add_request(2, make_prompt(3), ignore));
  ASSERT_FALSE(s->add_request(3, make_prompt(3), stop));
  ASSERT_FALSE(s->add_request(4, make_prompt(8), greedy(100)));
  std::map<int64_t, token_delta> last;
  std::map<int64_t, std::vector<int32_t>> outputs;
  int step = 0;
  while (s->has_unfinished()) {
    step_plan plan = s->schedule();
    step_result result = fake_run(plan);
    // Request 1 samples EOS at its second token; request 2 too, but ignores it.
    for (auto& t : result.tokens) {
      if ((t.request_id == 1 || t.request_id == 2) && step == 1) t.token_id = testing::test_eos;
    }
    for (auto& d : s->update(plan, result)) {
      outputs[d.request_id].insert(outputs[d.request_id].end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finished()) last[d.request_id] = d;
    }
    ++step;
  }
  EXPECT_EQ(outputs[1], (std::vector<int32_t>{1000, testing::test_eos}));
  EXPECT_EQ(last[1].finish, finish_reason::stop);
  EXPECT_EQ(outputs[2], (std::vector<int32_t>{1000, testing::test_eos, 1002}));
  EXPECT_EQ(last[2].finish, finish_reason::length);
  EXPECT_EQ(outputs[3], (std::vector<int32_t>{1000, 1001}));
  EXPECT_EQ(last[3].finish, finish_reason::stop);
  EXPECT_EQ(outputs[4].size(), 4u);  // 8 + 4 = max_model_len
  EXPECT_EQ(last[4].finish, finish_reason::length);
  ASSERT_TRUE(last[4].metrics.has_value());
  EXPECT_EQ(last[4].metrics->num_prompt_tokens, 8);
  EXPECT_GE(last[4].metrics->e2e, last[4].metrics->ttft);
  EXPECT_EQ(s->num_free_blocks(), 64);
}

TEST(scheduler, many_requests_tiny_pool_small_budget_all_finish_and_free_everything) {
  auto s = create_scheduler(/*num_blocks=*/12, /*block_size=*/4, /*max_num_batched_tokens=*/7, /*max_num_seqs=*/5);
  for (int i = 0; i < 20; ++i) {
    ASSERT_FALSE(s->add_request(i, make_prompt(3 + i % 9, 7 * i), greedy(5 + i % 13), i % 3));
  }
  auto outputs = run_to_end(*s);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(outputs[i], expected_outputs(5 + i % 13)) << i;
  EXPECT_EQ(s->num_free_blocks(), 12);
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_EQ(s->num_waiting(), 0);
}

}  // namespace
}  // namespace troupe
