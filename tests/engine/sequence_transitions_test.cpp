// A sequence changes only through its named transitions, and each checks before it changes: a
// transition the sequence's state does not allow throws std::logic_error and leaves it as it was.

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "engine/sequence.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::greedy;
using testing::make_prompt;

// What the scheduler reads of a sequence: any change of state shows here.
struct counts {
  sequence_status status;
  int computed, inflight, pending, tokens, blocks_on_worker;
  bool operator==(const counts&) const = default;
};
counts counts_of(const sequence& seq) {
  return {seq.status(),     seq.num_computed_tokens(), seq.num_inflight_tokens(), seq.num_pending_samples(),
          seq.num_tokens(), seq.num_blocks_on_worker()};
}

// Sampled tokens with these ids, as a step returns them for request 1.
std::vector<sampled_token> sampled(std::vector<int32_t> ids) {
  std::vector<sampled_token> tokens;
  for (int32_t id : ids) tokens.push_back({1, id, 0.0f, {}, {}});
  return tokens;
}

scheduled_sequence entry_for(const sequence& seq, int num_new_tokens, bool sample) {
  scheduled_sequence entry;
  entry.request_id = seq.request_id();
  entry.num_computed_tokens = seq.num_scheduled_tokens();
  entry.new_token_ids.assign(static_cast<size_t>(num_new_tokens), 7);
  entry.block_table = {0, 1};
  entry.sample = sample;
  return entry;
}

TEST(sequence_transitions, a_prompt_runs_in_two_chunks_and_samples) {
  sequence seq(1, make_prompt(20), greedy(4), 0, 0);
  seq.admit(4, /*step_id=*/3, engine_clock::now());
  EXPECT_EQ(seq.status(), sequence_status::running);
  EXPECT_EQ(seq.admitted_step(), 3u);
  EXPECT_EQ(seq.metrics().num_cached_tokens, 4);
  seq.planned(entry_for(seq, 10, false));
  EXPECT_EQ(seq.num_scheduled_tokens(), 14);
  seq.chunk_computed(10);
  EXPECT_EQ(seq.num_computed_tokens(), 14);
  seq.planned(entry_for(seq, 6, true));
  EXPECT_EQ(seq.num_pending_samples(), 1);
  EXPECT_EQ(seq.num_expected_tokens(), 21);
  seq.sample_returned(6, /*num_drafts=*/0, /*num_verified=*/1, sampled({1000}), engine_clock::now());
  EXPECT_EQ(counts_of(seq), (counts{sequence_status::running, 20, 0, 0, 21, 2}));
  EXPECT_TRUE(seq.known_to_worker());
}

TEST(sequence_transitions, accepted_drafts_count_as_computed_up_to_the_token_that_ends_it) {
  sequence seq(1, make_prompt(8), greedy(10), 0, 0);
  seq.admit(0, 1, engine_clock::now());
  seq.planned(entry_for(seq, 8, true));
  // Three drafts verified, four tokens back; the second ends the request, so two are outputs.
  seq.sample_returned(8, 3, 4, sampled({1000, 1001}), engine_clock::now());
  EXPECT_EQ(seq.num_tokens(), 10);
  EXPECT_EQ(seq.num_computed_tokens(), 9) << "never past the last output";
  EXPECT_EQ(seq.metrics().num_draft_tokens, 3);
  EXPECT_EQ(seq.metrics().num_accepted_tokens, 1);
}

TEST(sequence_transitions, a_transition_its_state_does_not_allow_changes_nothing) {
  sequence seq(1, make_prompt(20), greedy(4), 0, 0);
  const counts waiting = counts_of(seq);
  EXPECT_THROW(seq.preempt(), std::logic_error);
  EXPECT_THROW(seq.planned(entry_for(seq, 4, false)), std::logic_error);
  EXPECT_THROW(seq.kv_complete(), std::logic_error);
  EXPECT_THROW(seq.reserve_kv(20, engine_clock::now()), std::logic_error) << "not a decode-only request";
  EXPECT_THROW(seq.hand_over(std::vector<int32_t>{5}, engine_clock::now()), std::logic_error);
  EXPECT_EQ(counts_of(seq), waiting);

  seq.admit(0, 1, engine_clock::now());
  EXPECT_THROW(seq.admit(0, 2, engine_clock::now()), std::logic_error) << "admitted twice";
  scheduled_sequence elsewhere = entry_for(seq, 4, false);
  elsewhere.num_computed_tokens = 2;
  EXPECT_THROW(seq.planned(elsewhere), std::logic_error) << "an entry that does not start where it was planned";
  scheduled_sequence other = entry_for(seq, 4, false);
  other.request_id = 2;
  EXPECT_THROW(seq.planned(other), std::logic_error);
  seq.planned(entry_for(seq, 4, false));
  const counts planned = counts_of(seq);
  EXPECT_THROW(seq.chunk_computed(5), std::logic_error) << "more than its tokens in flight";
  EXPECT_THROW(seq.sample_returned(4, 0, 1, sampled({9}), engine_clock::now()), std::logic_error)
      << "no sample pending";
  EXPECT_EQ(counts_of(seq), planned);

  seq.finish(sequence_status::finished_aborted, engine_clock::now());
  EXPECT_THROW(seq.finish(sequence_status::finished_stopped, engine_clock::now()), std::logic_error);
  EXPECT_EQ(seq.status(), sequence_status::finished_aborted);
}

TEST(sequence_transitions, a_preempted_sequence_starts_over_and_counts_the_preemption) {
  sequence seq(1, make_prompt(20), greedy(4), 0, 0);
  seq.admit(0, 1, engine_clock::now());
  seq.planned(entry_for(seq, 20, true));
  seq.preempt();
  EXPECT_EQ(counts_of(seq), (counts{sequence_status::preempted, 0, 0, 0, 20, 0}));
  EXPECT_EQ(seq.metrics().num_preemptions, 1);
  seq.admit(16, 5, engine_clock::now());
  EXPECT_EQ(seq.num_computed_tokens(), 16);
  EXPECT_EQ(seq.metrics().num_cached_tokens, 0) << "usage counts the first admission's hit";
}

TEST(sequence_transitions, a_decode_only_request_starts_once_its_kv_and_first_token_came) {
  sequence seq(1, make_prompt(20), greedy(4), 0, 0, engine_clock::now(), {}, {kv_role::receive, 3, {}});
  seq.reserve_kv(20, engine_clock::now());
  EXPECT_EQ(seq.status(), sequence_status::waiting_for_kv);
  EXPECT_THROW(seq.start_from_kv(2), std::logic_error) << "nothing arrived yet";
  seq.kv_complete();
  EXPECT_FALSE(seq.ready_to_start());
  seq.hand_over(std::vector<int32_t>{1000}, engine_clock::now());
  EXPECT_THROW(seq.hand_over(std::vector<int32_t>{1001}, engine_clock::now()), std::logic_error) << "handed over twice";
  ASSERT_TRUE(seq.ready_to_start());
  seq.start_from_kv(2);
  EXPECT_EQ(counts_of(seq), (counts{sequence_status::running, 20, 0, 0, 21, 0}));
  EXPECT_EQ(seq.num_handed_over_tokens(), 1);
}

}  // namespace
}  // namespace troupe
