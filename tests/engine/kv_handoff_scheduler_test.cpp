// The scheduler's halves of a disaggregated request (engine/kv_handoff.hpp): a prefill-only
// request is computed to its first token and handed off; a decode-only one reserves blocks,
// waits without computing, and continues exactly where an undisturbed run would.

#include <gtest/gtest.h>

#include <map>

#include "engine/scheduler.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::make_prompt;
using testing::test_eos;

std::vector<int32_t> run_to_end(scheduler& s, int64_t id, std::vector<int32_t> outputs = {}) {
  for (int step = 0; step < 1000 && s.has_unfinished(); ++step) {
    step_plan plan = s.schedule();
    if (plan.empty()) break;
    for (const token_delta& d : s.update(plan, fake_run(plan))) {
      if (d.request_id == id) outputs.insert(outputs.end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  return outputs;
}

// Request 9 (a 40-token prompt, 6 greedy outputs) run whole on one ordinary scheduler.
std::vector<int32_t> undisturbed_outputs() {
  auto plain = create_scheduler(64, 16);
  EXPECT_FALSE(plain->add_request(9, make_prompt(40), greedy(6)));
  return run_to_end(*plain, 9);
}

TEST(kv_handoff_scheduler, a_prefill_only_request_is_handed_off_after_its_first_token) {
  auto s = create_scheduler(64, 16, /*max_num_batched_tokens=*/16);
  ASSERT_FALSE(s->add_request(5, make_prompt(40), greedy(10), 0, engine_clock::now(), {}, {kv_role::send, 77, {}}));
  std::vector<token_delta> last;
  for (int chunk = 0; chunk < 3; ++chunk) {
    step_plan plan = s->schedule();
    ASSERT_EQ(plan.sequences.size(), 1u);
    EXPECT_EQ(plan.sequences[0].kv_send_transfer_id, chunk == 0 ? 77u : 0u) << "only the starting entry names it";
    last = s->update(plan, fake_run(plan));
  }
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].token_ids, std::vector<int32_t>{1000});
  EXPECT_TRUE(last[0].handed_off);
  EXPECT_FALSE(last[0].finished()) << "the decode half finishes it, not the prefill half";
  EXPECT_EQ(s->find(5), nullptr);
  EXPECT_EQ(s->num_free_blocks(), 64);
  EXPECT_FALSE(s->has_unfinished());
  // The worker hears that the request is gone (with the next plan).
  ASSERT_FALSE(s->add_request(6, make_prompt(4), greedy(1)));
  const step_plan next = s->schedule();
  EXPECT_EQ(next.finished_ids, std::vector<int64_t>{5});
}

TEST(kv_handoff_scheduler, async_scheduling_plans_nothing_past_a_prefill_only_request_s_first_token) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(5, make_prompt(20), greedy(10), 0, engine_clock::now(), {}, {kv_role::send, 1, {}}));
  const step_plan first = s->schedule();
  const step_plan second = s->schedule();  // planned while the first is out
  EXPECT_TRUE(second.empty()) << "a decode step for a request about to be handed off";
  const auto deltas = s->update(first, fake_run(first));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_TRUE(deltas[0].handed_off);
}

TEST(kv_handoff_scheduler, a_prefill_only_request_that_ends_at_its_first_token_finishes_normally) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(5, make_prompt(20), greedy(1), 0, engine_clock::now(), {}, {kv_role::send, 1, {}}));
  const step_plan plan = s->schedule();
  const auto deltas = s->update(plan, fake_run(plan));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_FALSE(deltas[0].handed_off);
  EXPECT_EQ(deltas[0].finish, finish_reason::length);
}

TEST(kv_handoff_scheduler, a_decode_only_request_waits_for_its_kv_and_first_token_then_continues_as_one_run) {
  const std::vector<int32_t> undisturbed = undisturbed_outputs();

  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(40), greedy(6), 0, engine_clock::now(), {},
                              {kv_role::receive, 42, "17@prefill-node"}));
  EXPECT_TRUE(s->schedule().empty()) << "nothing to compute: the KV comes from elsewhere";
  const std::vector<kv_reservation> reserved = s->take_kv_reservations();
  ASSERT_EQ(reserved.size(), 1u);
  EXPECT_EQ(reserved[0].request_id, 9);
  EXPECT_EQ(reserved[0].transfer_id, 42u);
  EXPECT_EQ(reserved[0].peer, "17@prefill-node") << "the KV agent keys kv_transport nccl's pair by it";
  EXPECT_EQ(reserved[0].num_tokens, 40);
  EXPECT_EQ(reserved[0].block_ids.size(), 3u);
  EXPECT_EQ(s->num_free_blocks(), 61);
  EXPECT_EQ(s->find(9)->status(), sequence_status::waiting_for_kv);
  EXPECT_EQ(s->num_waiting_for_kv(), 1);

  EXPECT_FALSE(s->kv_arrived(9, 41)) << "another transfer's word";
  EXPECT_TRUE(s->kv_arrived(9, 42));
  EXPECT_TRUE(s->schedule().empty()) << "the first token has not come";
  EXPECT_EQ(s->hand_over(9, 42, std::vector<int32_t>{undisturbed[0]}), std::nullopt);
  const step_plan plan = s->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u);
  const scheduled_sequence& entry = plan.sequences[0];
  EXPECT_EQ(entry.num_computed_tokens, 40) << "the prompt's KV is in the pool";
  EXPECT_EQ(entry.new_token_ids, std::vector<int32_t>{undisturbed[0]});
  EXPECT_EQ(entry.output_index, 1) << "seeded sampling goes on at the same index";
  EXPECT_EQ(entry.block_table_start, 0);
  std::vector<int32_t> outputs{undisturbed[0]};
  for (const token_delta& d : s->update(plan, fake_run(plan)))
    outputs.insert(outputs.end(), d.token_ids.begin(), d.token_ids.end());
  EXPECT_EQ(run_to_end(*s, 9, outputs), undisturbed);
  EXPECT_EQ(s->num_free_blocks(), 64);
}

TEST(kv_handoff_scheduler, a_first_token_may_come_before_the_kv) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(20), greedy(4), 0, engine_clock::now(), {}, {kv_role::receive, 3, {}}));
  s->schedule();
  EXPECT_EQ(s->hand_over(9, 3, std::vector<int32_t>{1000}), std::nullopt);
  EXPECT_TRUE(s->schedule().empty());
  EXPECT_TRUE(s->kv_arrived(9, 3));
  EXPECT_EQ(s->schedule().sequences.size(), 1u);
}

TEST(kv_handoff_scheduler, a_first_token_handed_over_before_the_reservation_is_not_part_of_the_kv) {
  // The prefill side can be quicker than this admission: the reservation is still for the
  // prompt's KV only, and the token is the first step's input.
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(20), greedy(4), 0, engine_clock::now(), {}, {kv_role::receive, 3, {}}));
  EXPECT_EQ(s->hand_over(9, 3, std::vector<int32_t>{1000}), std::nullopt);
  s->schedule();
  const std::vector<kv_reservation> reserved = s->take_kv_reservations();
  ASSERT_EQ(reserved.size(), 1u);
  EXPECT_EQ(reserved[0].num_tokens, 20);
  EXPECT_TRUE(s->kv_arrived(9, 3));
  const step_plan plan = s->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].num_computed_tokens, 20);
  EXPECT_EQ(plan.sequences[0].new_token_ids, std::vector<int32_t>{1000});
}

TEST(kv_handoff_scheduler, a_reservation_needs_no_token_budget) {
  // Decodes use up the whole budget every step; the reservation is made all the same.
  auto s = create_scheduler(64, 16, /*max_num_batched_tokens=*/1);
  ASSERT_FALSE(s->add_request(1, make_prompt(1), greedy(50)));
  step_plan plan = s->schedule();
  s->update(plan, fake_run(plan));
  ASSERT_FALSE(s->add_request(9, make_prompt(20), greedy(4), 0, engine_clock::now(), {}, {kv_role::receive, 3, {}}));
  plan = s->schedule();
  EXPECT_EQ(plan.num_tokens(), 1);
  EXPECT_EQ(s->take_kv_reservations().size(), 1u);
}

TEST(kv_handoff_scheduler, a_reservation_counts_against_max_num_seqs_and_is_never_preempted) {
  // 4 blocks: the reservation takes 2; a running request that grows must not take them.
  auto s = create_scheduler(4, 16, 8192, /*max_num_seqs=*/2);
  ASSERT_FALSE(s->add_request(1, make_prompt(20), greedy(4), 0, engine_clock::now(), {}, {kv_role::receive, 5, {}}));
  ASSERT_FALSE(s->add_request(2, make_prompt(10), greedy(40)));
  ASSERT_FALSE(s->add_request(3, make_prompt(4), greedy(4)));
  step_plan plan = s->schedule();
  EXPECT_EQ(plan.sequences.size(), 1u) << "request 3 waits: the reservation and request 2 fill max_num_seqs";
  for (int step = 0; step < 60 && !plan.empty(); ++step) {
    s->update(plan, fake_run(plan));
    EXPECT_EQ(s->find(1)->status(), sequence_status::waiting_for_kv);
    EXPECT_EQ(s->find(1)->blocks().block_ids.size(), 2u);
    plan = s->schedule();
  }
}

TEST(kv_handoff_scheduler, an_abort_or_a_failed_transfer_gives_the_reserved_blocks_back) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(40), greedy(4), 0, engine_clock::now(), {}, {kv_role::receive, 1, {}}));
  s->schedule();
  EXPECT_EQ(s->num_free_blocks(), 61);
  const auto aborted = s->abort(9);
  ASSERT_TRUE(aborted);
  EXPECT_EQ(aborted->finish, finish_reason::abort);
  EXPECT_EQ(s->num_free_blocks(), 64);
  EXPECT_EQ(s->num_waiting_for_kv(), 0);
  EXPECT_FALSE(s->has_unfinished());
  ASSERT_FALSE(s->add_request(10, make_prompt(4), greedy(1)));
  EXPECT_TRUE(s->schedule().finished_ids.empty()) << "the worker never knew the reservation";
}

TEST(kv_handoff_scheduler, a_handed_over_token_that_would_have_ended_the_request_is_refused) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(20), greedy(4, /*ignore_eos=*/false), 0, engine_clock::now(), {},
                              {kv_role::receive, 1, {}}));
  s->schedule();
  EXPECT_NE(s->hand_over(9, 1, std::vector<int32_t>{test_eos}).value_or("").find("ends the request"),
            std::string::npos);
  EXPECT_EQ(s->hand_over(10, 1, std::vector<int32_t>{5}), std::nullopt) << "an unknown request is ignored";
}

// A refused hand-over must leave the sequence as it was: the tokens before the bad one are not
// kept, and the request can still be handed over (or aborted) whole.
TEST(kv_handoff_scheduler, a_refused_hand_over_changes_nothing) {
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(20), greedy(4, /*ignore_eos=*/false), 0, engine_clock::now(), {},
                              {kv_role::receive, 1, {}}));
  s->schedule();
  const sequence* seq = s->find(9);
  ASSERT_NE(seq, nullptr);
  const int tokens_before = seq->num_tokens();
  EXPECT_NE(s->hand_over(9, 1, std::vector<int32_t>{5, 6, test_eos}).value_or("").find("ends the request"),
            std::string::npos);
  EXPECT_EQ(seq->num_tokens(), tokens_before);
  EXPECT_EQ(seq->num_handed_over_tokens(), 0);
  EXPECT_NE(s->hand_over(9, 1, std::vector<int32_t>{5, -1}).value_or("").find("outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(seq->num_tokens(), tokens_before);
  EXPECT_EQ(s->hand_over(9, 1, std::vector<int32_t>{5}), std::nullopt);
  EXPECT_EQ(seq->num_tokens(), tokens_before + 1);
  EXPECT_EQ(seq->num_handed_over_tokens(), 1);
}

// Once running, a decode-only request is an ordinary one: when it loses its KV (a pipeline stage
// restarted, or preemption) it is recomputed from its tokens, not given a second reservation
// for a KV that will never come again.
TEST(kv_handoff_scheduler, a_running_decode_only_request_that_loses_its_kv_is_recomputed) {
  const std::vector<int32_t> undisturbed = undisturbed_outputs();
  auto s = create_scheduler(64, 16);
  ASSERT_FALSE(s->add_request(9, make_prompt(40), greedy(6), 0, engine_clock::now(), {}, {kv_role::receive, 4, {}}));
  s->schedule();
  ASSERT_EQ(s->take_kv_reservations().size(), 1u);
  ASSERT_TRUE(s->kv_arrived(9, 4));
  ASSERT_EQ(s->hand_over(9, 4, std::vector<int32_t>{undisturbed[0]}), std::nullopt);
  std::vector<int32_t> outputs{undisturbed[0]};
  const step_plan first = s->schedule();
  for (const token_delta& d : s->update(first, fake_run(first)))
    outputs.insert(outputs.end(), d.token_ids.begin(), d.token_ids.end());

  EXPECT_EQ(s->recompute_all_running(), 1);
  EXPECT_EQ(s->find(9)->status(), sequence_status::preempted);
  const step_plan recompute = s->schedule();
  EXPECT_TRUE(s->take_kv_reservations().empty()) << "its KV came once";
  ASSERT_EQ(recompute.sequences.size(), 1u);
  EXPECT_EQ(recompute.sequences[0].num_computed_tokens, 0) << "recomputed from its first token";
  EXPECT_EQ(s->find(9)->status(), sequence_status::running);
  for (const token_delta& d : s->update(recompute, fake_run(recompute)))
    outputs.insert(outputs.end(), d.token_ids.begin(), d.token_ids.end());
  EXPECT_EQ(run_to_end(*s, 9, outputs), undisturbed);
  EXPECT_EQ(s->num_free_blocks(), 64);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Behind a sliding window (every layer slides, engine_config::kv_window): a prefill-only request
// keeps every block while its KV streams out of them, where an ordinary request gives back
// those the window has left.
TEST(kv_handoff_scheduler, a_prefill_only_request_keeps_its_blocks_behind_a_sliding_window) {
  engine_config config;
  config.num_kv_blocks = 64;
  config.block_size = 16;
  config.max_num_batched_tokens = 32;
  config.kv_window = 32;
  auto held_after = [&](kv_handoff kv, int steps) {
    scheduler s(config, std::vector<int32_t>{test_eos});
    EXPECT_FALSE(s.add_request(5, make_prompt(200), greedy(10), 0, engine_clock::now(), {}, kv));
    for (int step = 0; step < steps; ++step) {
      step_plan plan = s.schedule();
      s.update(plan, fake_run(plan));
    }
    return s.find(5)->blocks().num_held_blocks();
  };
  // When the fifth chunk of 32 was planned (128 tokens computed, the next query at 128 sees keys
  // from 97 on), blocks 0-5 (tokens 0-95) had left the window; 10 blocks cover the 160 tokens.
  EXPECT_EQ(held_after({}, 5), 10 - 6);
  EXPECT_EQ(held_after({kv_role::send, 7, {}}, 5), 10);
}

}  // namespace
}  // namespace troupe
