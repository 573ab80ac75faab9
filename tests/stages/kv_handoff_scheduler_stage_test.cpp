// The scheduler stage's part in disaggregation: reservations go out for the KV agent, a failed
// transfer goes to the router without a client-visible delta, and the router's quiet abort of a
// half it runs again leaves nothing behind that could touch the id's next run.

#include <gtest/gtest.h>

#include <deque>
#include <optional>

#include "stages/scheduler_stage.hpp"
#include "tests/stages/scheduler_stage_support.hpp"

namespace troupe::test {
namespace {

schedule_request receiving(int64_t id, uint64_t transfer) {
  schedule_request r = make_request(id, 4);
  r.kv = kv_handoff{kv_role::receive, transfer, {}};
  return r;
}

TEST(kv_handoff_scheduler_stage, a_receiving_request_is_reserved_for_the_kv_agent_and_plans_nothing) {
  scheduler_stage stage(small_stage_config(true), {});
  scheduler_stage::outputs out = stage.add(receiving(7, 70));
  EXPECT_TRUE(out.plans.empty());
  ASSERT_EQ(out.kv_reservations.size(), 1u);
  EXPECT_EQ(out.kv_reservations[0].transfer_id, 70u);
  EXPECT_EQ(out.kv_reservations[0].num_tokens, 5);
  EXPECT_EQ(stage.stats(1).num_waiting_for_kv, 1);

  out = stage.kv_arrived(kv_arrival_msg{7, 70, true, {}});
  ASSERT_EQ(out.kv_landed.size(), 1u) << "the router hears the KV landed";
  EXPECT_TRUE(out.plans.empty()) << "the first token has not come";
  out = stage.hand_over(kv_handover_msg{7, 70, {42}});
  ASSERT_GE(out.plans.size(), 1u);  // with async scheduling, the step after it too
  EXPECT_EQ(out.plans[0].sequences[0].new_token_ids, std::vector<int32_t>{42});
  // Run it to its end: the final delta's timeline has the KV's wait (for the trace).
  std::optional<request_timeline> final_timeline;
  std::deque<step_plan> pending(out.plans.begin(), out.plans.end());
  for (int step = 0; step < 20 && !pending.empty() && !final_timeline; ++step) {
    const step_plan plan = pending.front();
    pending.pop_front();
    step_done done;
    done.result.step_id = plan.step_id;
    for (const auto& s : plan.sequences) {
      if (s.sample) done.result.tokens.push_back({s.request_id, 50, 0.0f, {}, {}});
    }
    out = stage.step_finished(done);
    for (size_t i = 0; i < out.tokens.deltas.size(); ++i) {
      if (out.tokens.deltas[i].finished()) final_timeline = out.tokens.timelines[i];
    }
    pending.insert(pending.end(), out.plans.begin(), out.plans.end());
  }
  ASSERT_TRUE(final_timeline);
  EXPECT_GT(final_timeline->kv_landed_ns, 0);
  EXPECT_GE(final_timeline->kv_landed_ns, final_timeline->kv_reserved_ns);
}

TEST(kv_handoff_scheduler_stage, a_failed_transfer_goes_to_the_router_not_the_client) {
  scheduler_stage stage(small_stage_config(false), {});
  stage.add(receiving(7, 70));
  scheduler_stage::outputs out = stage.kv_arrived(kv_arrival_msg{7, 69, false, "stale"});
  EXPECT_TRUE(out.kv_failures.empty()) << "another transfer's failure";
  out = stage.kv_arrived(kv_arrival_msg{7, 70, false, "its deadline passed"});
  ASSERT_EQ(out.kv_failures.size(), 1u);
  EXPECT_EQ(out.kv_failures[0].why, "its deadline passed");
  EXPECT_TRUE(out.tokens.empty()) << "no delta: the request goes on elsewhere";
  EXPECT_EQ(stage.stats(1).num_waiting_for_kv, 0);
  EXPECT_EQ(stage.stats(1).num_free_blocks, 16);
}

TEST(kv_handoff_scheduler_stage, a_quiet_abort_says_nothing_and_spares_the_next_run_of_the_id) {
  scheduler_stage stage(small_stage_config(false), {});
  stage.add(receiving(7, 70));
  scheduler_stage::outputs out = stage.abort(7, /*quietly=*/true);
  EXPECT_TRUE(out.tokens.empty()) << "a quiet abort sends no final delta";
  ASSERT_EQ(out.kv_cancels.size(), 1u);
  EXPECT_EQ(out.kv_cancels[0], 70u);
  // A quiet abort of an id not here (its half was handed off) is not an early abort either.
  EXPECT_TRUE(stage.abort(8, true).tokens.empty());
  out = stage.add(make_request(8, 2));
  EXPECT_EQ(out.plans.size(), 1u) << "the id's next run was killed by a remembered abort";
  out = stage.add(make_request(7, 2));
  EXPECT_TRUE(out.refusals.empty());
}

TEST(kv_handoff_scheduler_stage, an_abort_after_the_hand_off_does_not_kill_the_id_s_next_run) {
  scheduler_stage stage(small_stage_config(false), {});
  schedule_request sending = make_request(9, 4);
  sending.kv = kv_handoff{kv_role::send, 90, {}};
  scheduler_stage::outputs out = stage.add(sending);
  ASSERT_EQ(out.plans.size(), 1u);
  step_done done;
  done.result.step_id = out.plans[0].step_id;
  done.result.tokens.push_back({9, 11, 0.0f, {}, {}});
  out = stage.step_finished(done);
  ASSERT_EQ(out.tokens.deltas.size(), 1u);
  EXPECT_TRUE(out.tokens.deltas[0].handed_off);
  EXPECT_TRUE(stage.abort(9).tokens.empty()) << "the abort came after the hand-off";
  out = stage.add(make_request(9, 2));
  EXPECT_EQ(out.plans.size(), 1u) << "the late abort was kept and killed the id's next run";
}

}  // namespace
}  // namespace troupe::test
