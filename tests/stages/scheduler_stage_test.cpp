// The scheduler stage without actors: one step in flight, aborts that overtake their request,
// failed steps ending their requests, and every block free at the end.

#include <gtest/gtest.h>

#include "stages/scheduler_stage.hpp"
#include "tests/stages/scheduler_stage_support.hpp"

namespace troupe::test {
namespace {

engine_config small_config() { return small_stage_config(/*async_scheduling=*/false); }

// Answers every sampled row with token 9.
step_done answer(const step_plan& plan) {
  step_done done;
  done.result.step_id = plan.step_id;
  for (const auto& s : plan.sequences) {
    if (s.sample) done.result.tokens.push_back(sampled_token{s.request_id, 9, 0.0f, {}, {}});
  }
  done.compute_ns = 1;
  return done;
}

TEST(scheduler_stage, keeps_one_step_in_flight_and_frees_every_block) {
  scheduler_stage stage(small_config(), {2});
  auto out = stage.add(make_request(1, 3));
  ASSERT_EQ(out.plans.size(), 1u);
  EXPECT_TRUE(stage.add(make_request(2, 3)).plans.empty());  // a step is in flight
  std::vector<token_delta> finished;
  std::optional<step_plan> plan = out.plans.front();
  int steps = 0;
  while (plan && steps++ < 20) {
    auto next = stage.step_finished(answer(*plan));
    for (size_t i = 0; i < next.tokens.deltas.size(); ++i) {
      if (next.tokens.deltas[i].finished()) {
        finished.push_back(next.tokens.deltas[i]);
        EXPECT_GT(next.tokens.timelines[i].num_steps, 0);
      }
    }
    ASSERT_LE(next.plans.size(), 1u);
    plan.reset();
    if (!next.plans.empty()) plan = next.plans.front();
  }
  ASSERT_EQ(finished.size(), 2u);
  for (const auto& d : finished) EXPECT_EQ(d.finish, finish_reason::length);
  auto stats = stage.stats(7);
  EXPECT_EQ(stats.tag, 7u);
  EXPECT_EQ(stats.num_free_blocks, 16);
  EXPECT_EQ(stats.num_running, 0);
}

// Issue 10: the tokenizer, the scheduler and the worker may run on three hosts, so the timeline
// and the metrics the scheduler sends are durations, each two readings of one clock, bounded by
// the time the test itself saw pass: a steady-clock stamp (this host's uptime) would not be, and
// nothing from another stage's clock enters a difference.
TEST(scheduler_stage, sends_durations_of_its_own_clock_not_timestamps) {
  scheduler_stage stage(small_config(), {2});
  auto request = make_request(1, 3);
  request.tokenize_ns = 777;  // the tokenizer's duration, passed on as it is
  const timestamp_ns before = steady_now_ns();
  auto out = stage.add(std::move(request));
  ASSERT_EQ(out.plans.size(), 1u);
  std::optional<step_plan> plan = out.plans.front();
  std::optional<request_timeline> timeline;
  std::optional<request_metrics> metrics;
  int steps = 0;
  while (plan && steps < 20) {
    step_done done = answer(*plan);
    done.compute_ns = 4000 + steps++;  // the worker's own duration of this step
    auto next = stage.step_finished(done);
    for (size_t i = 0; i < next.tokens.deltas.size(); ++i) {
      if (!next.tokens.deltas[i].finished()) continue;
      timeline = next.tokens.timelines[i];
      metrics = next.tokens.deltas[i].metrics;
    }
    plan.reset();
    if (!next.plans.empty()) plan = next.plans.front();
  }
  const duration_ns elapsed = steady_now_ns() - before;
  ASSERT_TRUE(timeline);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(timeline->num_steps, steps);
  EXPECT_EQ(timeline->tokenize_ns, 777);
  EXPECT_EQ(timeline->first_step_compute_ns, 4000);
  EXPECT_GE(timeline->queue_ns, 0);
  EXPECT_LE(timeline->queue_ns, timeline->first_step_done_ns);
  EXPECT_LE(timeline->first_step_done_ns, timeline->last_step_done_ns);
  EXPECT_LE(timeline->last_step_done_ns, elapsed);
  // The engine's metrics count from the scheduler's receipt too, on its clock.
  EXPECT_GE(metrics->queue_time, 0.0);
  EXPECT_LE(metrics->queue_time, metrics->ttft);
  EXPECT_LE(metrics->ttft, metrics->e2e);
  EXPECT_LE(metrics->e2e, static_cast<double>(elapsed) / 1e9);
}

TEST(scheduler_stage, an_abort_that_overtakes_its_request_ends_it_on_arrival) {
  scheduler_stage stage(small_config(), {2});
  auto early = stage.abort(5);
  EXPECT_TRUE(early.tokens.deltas.empty());
  auto out = stage.add(make_request(5, 3));
  EXPECT_TRUE(out.plans.empty());
  ASSERT_EQ(out.tokens.deltas.size(), 1u);
  EXPECT_EQ(out.tokens.deltas[0].finish, finish_reason::abort);
  EXPECT_EQ(stage.stats(0).num_waiting, 0);
}

TEST(scheduler_stage, a_failed_step_fails_its_requests_and_frees_their_blocks) {
  scheduler_stage stage(small_config(), {2});
  auto out = stage.add(make_request(1, 10));
  ASSERT_EQ(out.plans.size(), 1u);
  step_done failed;
  failed.result.step_id = out.plans.front().step_id;
  failed.error = "device lost";
  auto next = stage.step_finished(failed);
  // Through the detokenizer, which must forget the request before the frontend hears.
  EXPECT_TRUE(next.refusals.empty());
  ASSERT_EQ(next.tokens.failures.size(), 1u);
  EXPECT_EQ(next.tokens.failures[0].request_id, 1);
  EXPECT_EQ(next.tokens.failures[0].code, error_code::internal);
  EXPECT_NE(next.tokens.failures[0].message.find("device lost"), std::string::npos);
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
}

TEST(scheduler_stage, refusals_go_straight_to_the_frontend) {
  auto config = small_config();
  scheduler_stage stage(config, {2});
  auto r = make_request(1, 3);
  r.prompt_ids.assign(70, 5);  // longer than max_model_len
  auto out = stage.add(r);
  ASSERT_EQ(out.refusals.size(), 1u);
  EXPECT_EQ(out.refusals[0].code, error_code::bad_request);
  EXPECT_TRUE(out.tokens.empty()) << "the detokenizer never saw the request";
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// A result the scheduler cannot apply (here: a token for a request the step did not sample)
// ends the step's requests with an error naming the problem, frees their blocks, and leaves the
// stage serving: it used to throw out of step_finished and take the scheduler actor down.
TEST(scheduler_stage, a_malformed_result_fails_its_requests_and_the_stage_keeps_serving) {
  scheduler_stage stage(small_config(), {2});
  auto out = stage.add(make_request(1, 10));
  ASSERT_EQ(out.plans.size(), 1u);
  step_done bad = answer(out.plans.front());
  bad.result.tokens.push_back(sampled_token{77, 9, 0.0f, {}, {}});
  scheduler_stage::outputs next;
  ASSERT_NO_THROW(next = stage.step_finished(bad));
  ASSERT_EQ(next.tokens.failures.size(), 1u);
  EXPECT_EQ(next.tokens.failures[0].request_id, 1);
  EXPECT_EQ(next.tokens.failures[0].code, error_code::internal);
  EXPECT_NE(next.tokens.failures[0].message.find("malformed step result"), std::string::npos)
      << next.tokens.failures[0].message;
  EXPECT_NE(next.tokens.failures[0].message.find("request 77"), std::string::npos) << next.tokens.failures[0].message;
  EXPECT_TRUE(next.tokens.deltas.empty());
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
  EXPECT_FALSE(stage.step_in_flight());

  // The next request runs to the end.
  out = stage.add(make_request(2, 3));
  int num_tokens = 0;
  bool finished = false;
  for (int step = 0; step < 20 && !out.plans.empty(); ++step) {
    out = stage.step_finished(answer(out.plans.front()));
    for (const auto& d : out.tokens.deltas) {
      num_tokens += static_cast<int>(d.token_ids.size());
      finished = finished || d.finished();
    }
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(num_tokens, 3);
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
}

// A result naming another step is not dropped (the step's requests would wait for ever).
TEST(scheduler_stage, a_result_for_another_step_fails_its_requests) {
  scheduler_stage stage(small_config(), {2});
  auto out = stage.add(make_request(1, 10));
  ASSERT_EQ(out.plans.size(), 1u);
  step_done bad = answer(out.plans.front());
  bad.result.step_id += 3;
  auto next = stage.step_finished(bad);
  ASSERT_EQ(next.tokens.failures.size(), 1u);
  EXPECT_EQ(next.tokens.failures[0].request_id, 1);
  EXPECT_FALSE(stage.step_in_flight());
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
}

}  // namespace
}  // namespace troupe::test
