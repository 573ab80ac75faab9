// serving_metrics times requests from their arrival and their deltas' stamps: ttft to the first
// delta with tokens, itl between deltas, tpot over the tokens after the first, e2e to the final
// delta; queue time and preemptions come from the final delta.

#include <gtest/gtest.h>

#include "doors/serving_metrics.hpp"

namespace troupe {
namespace {

constexpr timestamp_ns ms = 1'000'000;

text_delta delta(int64_t id, std::vector<int32_t> tokens, finish_reason finish = finish_reason::none) {
  text_delta d;
  d.delta.request_id = id;
  d.delta.token_ids = std::move(tokens);
  d.delta.finish = finish;
  return d;
}

text_delta final_delta(int64_t id, std::vector<int32_t> tokens, finish_reason finish, int num_output,
                       int num_preemptions, duration_ns queue_ns) {
  text_delta d = delta(id, std::move(tokens), finish);
  request_metrics m;
  m.num_prompt_tokens = 7;
  m.num_output_tokens = num_output;
  m.num_preemptions = num_preemptions;
  d.delta.metrics = m;
  d.timeline.queue_ns = queue_ns;
  d.timeline.num_steps = num_output;
  return d;
}

TEST(serving_metrics, times_a_request_from_arrival_through_its_deltas) {
  serving_metrics metrics;
  metrics.arrived(5, 1000 * ms);
  EXPECT_FALSE(metrics.observe(delta(5, {}), 1002 * ms));  // no tokens yet: not the first token
  EXPECT_FALSE(metrics.observe(delta(5, {11}), 1010 * ms));
  EXPECT_FALSE(metrics.observe(delta(5, {12}), 1014 * ms));
  EXPECT_FALSE(metrics.observe(delta(5, {13, 14}), 1020 * ms));
  auto record = metrics.observe(final_delta(5, {15}, finish_reason::length, 5, 2, 3 * ms), 1030 * ms);
  ASSERT_TRUE(record);
  EXPECT_EQ(record->request_id, 5);
  EXPECT_EQ(record->arrival, 1000 * ms);
  EXPECT_EQ(record->first_token, 1010 * ms);
  EXPECT_EQ(record->finish, 1030 * ms);
  EXPECT_EQ(record->num_output_tokens, 5);

  const serving_metrics_snapshot s = metrics.snapshot();
  EXPECT_EQ(s.time_to_first_token.count(), 1u);
  EXPECT_NEAR(s.time_to_first_token.sum(), 0.010, 1e-12);
  EXPECT_EQ(s.inter_token_latency.count(), 3u);  // 4, 6, 10 ms: one per delta after the first
  EXPECT_NEAR(s.inter_token_latency.sum(), 0.020, 1e-12);
  EXPECT_EQ(s.time_per_output_token.count(), 1u);
  EXPECT_NEAR(s.time_per_output_token.sum(), 0.020 / 4, 1e-12);
  EXPECT_EQ(s.e2e_request_latency.count(), 1u);
  EXPECT_NEAR(s.e2e_request_latency.sum(), 0.030, 1e-12);
  EXPECT_EQ(s.request_queue_time.count(), 1u);
  EXPECT_NEAR(s.request_queue_time.sum(), 0.003, 1e-12);
  EXPECT_EQ(s.num_prompt_tokens, 7u);
  EXPECT_EQ(s.num_generation_tokens, 5u);
  EXPECT_EQ(s.num_preemptions, 2u);
  EXPECT_EQ(s.num_finished_length, 1u);
  EXPECT_EQ(metrics.num_live(), 0u);
}

TEST(serving_metrics, a_one_token_request_has_no_tpot_and_an_abort_in_the_queue_no_queue_time) {
  serving_metrics metrics;
  metrics.arrived(1, 0);
  metrics.arrived(2, 0);
  ASSERT_TRUE(metrics.observe(final_delta(1, {9}, finish_reason::stop, 1, 0, ms), 4 * ms));
  text_delta aborted = final_delta(2, {}, finish_reason::abort, 0, 0, 0);
  aborted.timeline.num_steps = 0;
  ASSERT_TRUE(metrics.observe(aborted, 6 * ms));
  const serving_metrics_snapshot s = metrics.snapshot();
  EXPECT_EQ(s.time_to_first_token.count(), 2u);  // the abort's first reply was its last
  EXPECT_EQ(s.time_per_output_token.count(), 0u);
  EXPECT_EQ(s.request_queue_time.count(), 1u);
  EXPECT_EQ(s.e2e_request_latency.count(), 2u);
  EXPECT_EQ(s.num_finished_stop, 1u);
  EXPECT_EQ(s.num_finished_abort, 1u);
}

TEST(serving_metrics, a_failed_request_is_forgotten_and_an_unknown_one_counted_not_timed) {
  serving_metrics metrics;
  metrics.arrived(3, 0);
  metrics.observe(delta(3, {1}), ms);
  metrics.forget(3);
  EXPECT_EQ(metrics.num_live(), 0u);
  EXPECT_FALSE(metrics.observe(final_delta(4, {2}, finish_reason::stop, 3, 1, ms), 2 * ms));
  const serving_metrics_snapshot s = metrics.snapshot();
  EXPECT_EQ(s.time_to_first_token.count(), 1u);  // request 3's, observed before it failed
  EXPECT_EQ(s.e2e_request_latency.count(), 0u);
  EXPECT_EQ(s.num_generation_tokens, 3u);
  EXPECT_EQ(s.num_preemptions, 1u);
  EXPECT_EQ(s.num_finished_stop, 1u);
}

}  // namespace
}  // namespace troupe
