// A scheduler's step log: steps recorded from plan to result with their batch composition,
// bounded, read back for a window as ages before the moment of reading.

#include <gtest/gtest.h>

#include "stages/step_log.hpp"

namespace troupe {
namespace {

step_outline outline(uint64_t id, std::vector<planned_sequence> sequences) {
  return step_outline{id, std::move(sequences)};
}

TEST(step_log, records_batch_composition_and_time_from_plan_to_result) {
  step_log log;
  log.planned(7, 1000);
  log.finished(outline(7, {{1, 0, 5, true}, {2, 9, 1, true}, {3, 0, 1, true}, {4, 16, 8, false}}), 1600, 450);
  const std::vector<step_event> steps = log.recent(10'000, 2000);
  ASSERT_EQ(steps.size(), 1u);
  const step_event& s = steps[0];
  EXPECT_EQ(s.step_id, 7u);
  EXPECT_EQ(s.age_ns, 1000);
  EXPECT_EQ(s.elapsed_ns, 600);
  EXPECT_EQ(s.compute_ns, 450);
  // 1: a whole prompt; 2: one sampled token; 3: a one-token prompt; 4: a later prompt chunk.
  EXPECT_EQ(s.num_prefill_sequences, 3);
  EXPECT_EQ(s.num_prefill_tokens, 5 + 1 + 8);
  EXPECT_EQ(s.num_decode_sequences, 1);
  EXPECT_EQ(s.num_decode_tokens, 1);
  EXPECT_EQ(s.request_ids, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(step_log, steps_in_flight_together_pair_by_id_run_one_after_the_other_and_an_unplanned_result_is_ignored) {
  step_log log;
  log.planned(1, 100);
  log.planned(2, 150);  // async scheduling: planned before step 1's result
  EXPECT_EQ(log.finished(outline(1, {{5, 3, 1, true}}), 300, 0), 200);
  EXPECT_EQ(log.finished(outline(9, {{5, 4, 1, true}}), 320, 0), 0);    // never planned
  EXPECT_EQ(log.finished(outline(2, {{5, 4, 1, true}}), 400, 0), 100);  // what the scheduler's step-time model learns
  const std::vector<step_event> steps = log.recent(1000, 500);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step_id, 1u);
  EXPECT_EQ(steps[0].elapsed_ns, 200);
  EXPECT_EQ(steps[1].step_id, 2u);
  // Step 2 was planned at 150, but the worker took it up when it answered step 1, at 300.
  EXPECT_EQ(steps[1].age_ns, 200);
  EXPECT_EQ(steps[1].elapsed_ns, 100);
}

TEST(step_log, keeps_only_its_capacity_and_reads_only_the_window) {
  step_log log(3);
  for (uint64_t i = 0; i < 5; ++i) {
    log.planned(i, static_cast<timestamp_ns>(i * 100));
    log.finished(outline(i, {{1, 1, 1, true}}), static_cast<timestamp_ns>(i * 100 + 10), 0);
  }
  EXPECT_EQ(log.size(), 3u);
  std::vector<step_event> all = log.recent(100'000, 1000);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().step_id, 2u);
  std::vector<step_event> recent = log.recent(700, 1000);  // started at 300 or later
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent.front().step_id, 3u);
}

}  // namespace
}  // namespace troupe
