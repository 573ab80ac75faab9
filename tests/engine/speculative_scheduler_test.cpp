// The scheduler's side of speculative decoding, with a scripted worker: draft slots are counted
// in the token budget and covered by KV blocks, never pass max_tokens or max_model_len, give way
// before anything is preempted, and a result's accepted drafts advance the request while its
// rejected slots are rolled back. Results that claim more than the slots allow are refused.

#include <gtest/gtest.h>

#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::greedy;
using testing::make_prompt;

sampling_params speculating(int max_tokens, int drafts) {
  sampling_params p = greedy(max_tokens);
  p.num_speculative_tokens = drafts;
  return p;
}

// The result of `plan` where request `id` proposed `num_drafts` drafts and had `accepted` of
// them accepted; every other sampling entry yields one token.
step_result result_with(const step_plan& plan, int64_t id, int num_drafts, int accepted) {
  step_result result;
  result.step_id = plan.step_id;
  for (const auto& s : plan.sequences) {
    if (!s.sample) continue;
    const int count = s.request_id == id ? accepted + 1 : 1;
    for (int i = 0; i < count; ++i) {
      sampled_token t{s.request_id, 500 + s.output_index + i, 0.0f, {}, {}};
      if (i == 0 && s.request_id == id) t.num_drafts = num_drafts;
      result.tokens.push_back(t);
    }
  }
  return result;
}

TEST(speculative_scheduler, slots_are_counted_in_the_budget_and_the_blocks) {
  auto sched = create_scheduler(/*num_blocks=*/64, /*block_size=*/4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), speculating(50, 5)));
  // The whole prompt and five drafts after it: 6 + 5 tokens, 3 blocks of 4.
  step_plan plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].num_draft_slots, 5);
  EXPECT_TRUE(plan.sequences[0].speculative);
  EXPECT_EQ(plan.sequences[0].penalty_token_ids, make_prompt(6)) << "the proposer needs the history";
  EXPECT_EQ(plan.sequences[0].block_table.size(), 3u);
  // 3 of 5 drafts accepted: the prompt and 3 drafts are computed; 4 new outputs.
  auto deltas = sched->update(plan, result_with(plan, 1, 5, 3));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].token_ids, (std::vector<int32_t>{500, 501, 502, 503}));
  const sequence* seq = sched->find(1);
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(seq->num_computed_tokens(), 9);
  EXPECT_EQ(seq->num_tokens(), 10);
  EXPECT_EQ(seq->metrics().num_draft_tokens, 5);
  EXPECT_EQ(seq->metrics().num_accepted_tokens, 3);
  // The next step computes the last output and 5 new drafts: positions 9..14, 4 blocks.
  plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].num_computed_tokens, 9);
  EXPECT_EQ(plan.sequences[0].new_token_ids, (std::vector<int32_t>{503}));
  EXPECT_EQ(plan.sequences[0].num_draft_slots, 5);
  EXPECT_EQ(plan.sequences[0].block_table_start + plan.sequences[0].block_table.size(), 4u);
  // Nothing accepted: one token, the slots rolled back.
  deltas = sched->update(plan, result_with(plan, 1, 5, 0));
  EXPECT_EQ(deltas[0].token_ids, (std::vector<int32_t>{504}));
  EXPECT_EQ(sched->find(1)->num_computed_tokens(), 10);
  EXPECT_EQ(sched->find(1)->metrics().num_sampling_steps, 2);
}

TEST(speculative_scheduler, slots_stop_at_the_budget_max_tokens_and_max_model_len) {
  auto tight_budget = create_scheduler(64, 4, /*max_num_batched_tokens=*/8);
  ASSERT_FALSE(tight_budget->add_request(1, make_prompt(6), speculating(50, 5)));
  EXPECT_EQ(tight_budget->schedule().sequences[0].num_draft_slots, 2) << "8 tokens: the prompt's 6 and 2 drafts";

  auto few_tokens = create_scheduler(64, 4);
  ASSERT_FALSE(few_tokens->add_request(1, make_prompt(6), speculating(3, 5)));
  EXPECT_EQ(few_tokens->schedule().sequences[0].num_draft_slots, 2) << "max_tokens 3: at most 3 outputs";

  auto short_context = create_scheduler(64, 4, 8192, 128, true, 1024, /*max_model_len=*/9);
  ASSERT_FALSE(short_context->add_request(1, make_prompt(6), speculating(3, 5)));
  EXPECT_EQ(short_context->schedule().sequences[0].num_draft_slots, 2) << "9 tokens of context: 3 outputs";

  auto off = create_scheduler(64, 4);
  ASSERT_FALSE(off->add_request(1, make_prompt(6), speculating(30, 0)));
  const step_plan plan = off->schedule();
  EXPECT_EQ(plan.sequences[0].num_draft_slots, 0);
  EXPECT_FALSE(plan.sequences[0].speculative);
  EXPECT_TRUE(plan.sequences[0].penalty_token_ids.empty());
}

TEST(speculative_scheduler, drafts_give_way_before_anything_is_preempted) {
  // 5 blocks of 4. The first request takes 3 (6 tokens and 4 drafts); the second fits only
  // without drafts.
  auto sched = create_scheduler(5, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), speculating(8, 4)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(6, 40), speculating(8, 4)));
  step_plan plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].num_draft_slots, 4);
  EXPECT_EQ(plan.sequences[1].num_draft_slots, 0);
  sched->update(plan, result_with(plan, 1, 4, 0));
  // Decoding: the first request's drafts fit its 3 blocks; the second's would need a block
  // the pool does not have, so it goes without instead of preempting the first.
  plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].num_draft_slots, 4);
  EXPECT_EQ(plan.sequences[1].num_draft_slots, 0);
  EXPECT_TRUE(plan.preempted_ids.empty());
  EXPECT_EQ(sched->num_free_blocks(), 0);
}

TEST(speculative_scheduler, an_output_that_stops_the_request_drops_the_drafts_after_it) {
  auto sched = create_scheduler(64, 4);
  sampling_params p = speculating(20, 4);
  p.stop_token_ids = {501};
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), p));
  const step_plan plan = sched->schedule();
  auto deltas = sched->update(plan, result_with(plan, 1, 4, 4));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].token_ids, (std::vector<int32_t>{500, 501}));
  EXPECT_EQ(deltas[0].finish, finish_reason::stop);
  ASSERT_TRUE(deltas[0].metrics);
  EXPECT_EQ(deltas[0].metrics->num_accepted_tokens, 1) << "only the drafts that became outputs";
  EXPECT_EQ(deltas[0].metrics->num_draft_tokens, 4);
  EXPECT_EQ(sched->num_free_blocks(), 64);
}

TEST(speculative_scheduler, refuses_results_beyond_the_slots) {
  auto sched = create_scheduler(64, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), speculating(20, 2)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(6, 40), speculating(20, 0)));
  const step_plan plan = sched->schedule();
  const step_outline outline = outline_of(plan);
  EXPECT_TRUE(outline.speculative);
  EXPECT_EQ(sched->check_result(outline, result_with(plan, 1, 2, 2)), std::nullopt);
  EXPECT_NE(sched->check_result(outline, result_with(plan, 1, 3, 3)).value_or("").find("which had 2 draft slots"),
            std::string::npos);
  EXPECT_NE(
      sched->check_result(outline, result_with(plan, 1, 1, 2)).value_or("").find("more than its 1 drafts and one"),
      std::string::npos);
  EXPECT_NE(
      sched->check_result(outline, result_with(plan, 2, 0, 1)).value_or("").find("more than its 0 drafts and one"),
      std::string::npos);
  EXPECT_THROW(sched->update(plan, result_with(plan, 1, 3, 3)), std::invalid_argument);
  EXPECT_EQ(sched->find(1)->num_computed_tokens(), 0) << "a refused result changes nothing";
}

TEST(speculative_scheduler, a_speculating_request_is_not_planned_behind_its_own_pending_sample) {
  engine_config config;
  config.num_kv_blocks = 64;
  config.block_size = 4;
  config.num_speculative_tokens = 3;  // the engine's default
  scheduler sched(config, {testing::test_eos});
  ASSERT_FALSE(sched.add_request(1, make_prompt(6), greedy(20)));
  ASSERT_FALSE(sched.add_request(2, make_prompt(6, 40), speculating(20, 0)));
  const step_plan first = sched.schedule();
  EXPECT_EQ(first.sequences[0].num_draft_slots, 3) << "-1 takes the engine's default";
  // Planned ahead, before the first step's result: only the plain request goes on.
  const step_plan ahead = sched.schedule();
  ASSERT_EQ(ahead.sequences.size(), 1u);
  EXPECT_EQ(ahead.sequences[0].request_id, 2);
  EXPECT_TRUE(ahead.sequences[0].input_from_previous_sample);
}

}  // namespace
}  // namespace troupe
