// The planner's simulation runs the real router and schedulers on a simulated clock: with a step
// model of known cost, each request's first token and end fall where the scheduling code puts
// them (chunks under the budget, the xPyD hand-off and KV transfer), and a cluster past its
// capacity misses its SLO.

#include <gtest/gtest.h>

#include <algorithm>

#include "planner/cluster_simulation.hpp"

namespace troupe {
namespace {

constexpr double step_s = 0.010;  // every step costs 10 ms, whatever its shape

simulated_cluster cluster_of(int mixed, int prefill = 0, int decode = 0) {
  simulated_cluster c;
  c.num_mixed = mixed;
  c.num_prefill = prefill;
  c.num_decode = decode;
  c.config.num_kv_blocks = 512;
  c.config.block_size = 16;
  c.config.max_model_len = 2048;
  c.config.max_num_batched_tokens = 2048;
  c.config.kv_window = 0;
  c.step_times.mixed = step_cost{{step_s, 0, 0, 0, 0}, 1};
  return c;
}

TEST(cluster_simulation, a_lone_request_takes_one_step_for_its_prompt_and_one_per_token_after) {
  const simulation_result r = simulate(cluster_of(1), {{0.0, 32, 5}});
  ASSERT_EQ(r.requests.size(), 1u);
  const simulated_outcome& o = r.requests[0];
  ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_EQ(o.output_tokens, 5);
  EXPECT_NEAR(o.ttft(), step_s, 1e-9);
  EXPECT_NEAR(o.finish_s, 5 * step_s, 1e-9);
  EXPECT_NEAR(o.tpot(), step_s, 1e-9);
  EXPECT_EQ(r.num_steps, 5);
}

TEST(cluster_simulation, with_async_scheduling_a_request_arriving_mid_step_waits_for_the_step_after_the_next) {
  // A decodes from 0; B arrives 5 ms into A's first step. One step at a time, B's prompt runs in
  // the second step (first token at 20 ms); with async scheduling the second step was planned
  // when the first started, so B's prompt runs in the third (first token at 30 ms), as serving
  // plans it.
  const std::vector<planned_request> workload{{0.0, 16, 10}, {0.005, 16, 2}};
  simulated_cluster one_at_a_time = cluster_of(1);
  const simulation_result sync = simulate(one_at_a_time, workload);
  ASSERT_TRUE(sync.requests[1].ok()) << sync.requests[1].error;
  EXPECT_NEAR(sync.requests[1].first_token_s, 2 * step_s, 1e-9);
  simulated_cluster overlapped = cluster_of(1);
  overlapped.config.async_scheduling = true;
  const simulation_result async = simulate(overlapped, workload);
  for (const simulated_outcome& o : async.requests) ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_NEAR(async.requests[1].first_token_s, 3 * step_s, 1e-9);
  // A still gets a token every step: its decodes are planned ahead on placeholders.
  EXPECT_EQ(async.requests[0].output_tokens, 10);
  EXPECT_NEAR(async.requests[0].finish_s, 10 * step_s, 1e-9);
}

TEST(cluster_simulation, prefill_and_decode_instances_step_at_their_own_roles_cost) {
  // Measured apart, a disaggregated server's prefill steps cost 30 ms and its decode steps 5 ms;
  // a mixed instance's model (10 ms) times neither.
  simulated_cluster c = cluster_of(0, 1, 1);
  c.step_times.prefill = step_cost{{0.030, 0, 0, 0, 0}, 1};
  c.step_times.decode = step_cost{{0.005, 0, 0, 0, 0}, 1};
  const simulation_result r = simulate(c, {{0.0, 32, 5}});
  const simulated_outcome& o = r.requests[0];
  ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_NEAR(o.ttft(), 0.030, 1e-9);
  EXPECT_NEAR(o.tpot(), 0.005, 1e-3);  // after the KV transfer, each token a 5 ms decode step
}

TEST(cluster_simulation, a_prompt_longer_than_the_budget_is_prefilled_in_chunks) {
  simulated_cluster c = cluster_of(1);
  c.config.max_num_batched_tokens = 16;
  const simulation_result r = simulate(c, {{0.0, 64, 3}});
  ASSERT_TRUE(r.requests[0].ok()) << r.requests[0].error;
  EXPECT_NEAR(r.requests[0].ttft(), 4 * step_s, 1e-9);  // 64 tokens in 16-token chunks
  EXPECT_NEAR(r.requests[0].finish_s, 6 * step_s, 1e-9);
}

TEST(cluster_simulation, requests_arriving_together_share_steps) {
  // Two prompts that fit one budget are prefilled in the same step, then decode together.
  const simulation_result r = simulate(cluster_of(1), {{0.0, 16, 4}, {0.0, 16, 4}});
  for (const simulated_outcome& o : r.requests) {
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_NEAR(o.ttft(), step_s, 1e-9);
    EXPECT_NEAR(o.finish_s, 4 * step_s, 1e-9);
  }
  EXPECT_EQ(r.num_steps, 4);
}

TEST(cluster_simulation, a_disaggregated_request_hands_off_after_its_prefill_and_decodes_once_its_kv_lands) {
  simulated_cluster c = cluster_of(0, 1, 1);
  c.kv_latency_s = 0.005;
  const simulation_result r = simulate(c, {{0.0, 32, 5}});
  const simulated_outcome& o = r.requests[0];
  ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_EQ(o.output_tokens, 5);
  EXPECT_NEAR(o.ttft(), step_s, 1e-9);  // the prefill instance's first token reaches the client
  // Tokens 2-5 on the decode instance, from when the KV landed (prefill end + 5 ms).
  EXPECT_NEAR(o.finish_s, step_s + 0.005 + 4 * step_s, 1e-9);
}

TEST(cluster_simulation, replicas_split_a_burst_that_one_instance_would_queue) {
  std::vector<planned_request> burst;
  // One token each, so no decode takes a share of a later step's budget: a prompt per step.
  for (int i = 0; i < 8; ++i) burst.push_back({0.0, 512, 1});
  simulated_cluster one = cluster_of(1);
  one.config.max_num_batched_tokens = 512;
  simulated_cluster two = one;
  two.num_mixed = 2;
  const simulation_result alone = simulate(one, burst);
  const simulation_result shared = simulate(two, burst);
  double last_alone = 0, last_shared = 0;
  for (const simulated_outcome& o : alone.requests) last_alone = std::max(last_alone, o.ttft());
  for (const simulated_outcome& o : shared.requests) last_shared = std::max(last_shared, o.ttft());
  EXPECT_NEAR(last_alone, 8 * step_s, 1e-9);
  EXPECT_NEAR(last_shared, 4 * step_s, 1e-9);
}

TEST(cluster_simulation, past_its_capacity_a_cluster_misses_the_slo_it_holds_below) {
  simulated_cluster c = cluster_of(1);
  c.step_times.mixed = step_cost{{0.002, 1e-4, 0, 0, 0}, 1};  // a 256-token prompt: ~28 ms
  const service_level slo{0.2, 0.05};
  std::vector<request_class> mix{{1.0, {256}, {16}}};
  const auto slow = draw_workload(mix, 100, 2.0, 1.0, 7);
  const auto fast = draw_workload(mix, 100, 200.0, 1.0, 7);
  EXPECT_GE(simulate(c, slow).attainment(slo), 0.99);
  EXPECT_LE(simulate(c, fast).attainment(slo), 0.5);
}

TEST(cluster_simulation, requests_not_finished_within_the_horizon_fail_as_such) {
  simulated_cluster c = cluster_of(1);
  const simulation_result r = simulate(c, {{0.0, 16, 1000}}, 1.0);  // 1,000 steps of 10 ms > 1 s
  ASSERT_FALSE(r.requests[0].ok());
  EXPECT_NE(r.requests[0].error.find("not finished"), std::string::npos) << r.requests[0].error;
}

TEST(cluster_simulation, a_request_the_scheduler_refuses_fails_with_its_reason) {
  simulated_cluster c = cluster_of(1);
  c.config.max_model_len = 64;
  const simulation_result r = simulate(c, {{0.0, 80, 10}, {0.0, 16, 2}});  // a prompt past the context
  EXPECT_FALSE(r.requests[0].ok());
  EXPECT_NE(r.requests[0].error.find("refused"), std::string::npos) << r.requests[0].error;
  EXPECT_TRUE(r.requests[1].ok()) << r.requests[1].error;
}

TEST(cluster_simulation, on_shared_cores_a_step_runs_at_the_share_it_gets) {
  // One core, and a client that keeps one core busy (1 request/s x 1 s of its CPU each): the
  // instance's steps run at half speed, so each 10 ms step ends after 20 ms.
  const std::vector<planned_request> workload{{0.0, 16, 5}, {1.0, 16, 5}};
  simulated_cluster c = cluster_of(1);
  const simulation_result alone = simulate(c, workload);
  ASSERT_TRUE(alone.requests[0].ok()) << alone.requests[0].error;
  EXPECT_NEAR(alone.requests[0].ttft(), step_s, 1e-9);
  c.host.cores = 1;
  c.host.client_seconds_per_request = 1.0;
  const simulation_result shared = simulate(c, workload);
  for (const simulated_outcome& o : shared.requests) {
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_NEAR(o.ttft(), 2 * step_s, 1e-9);
    EXPECT_NEAR(o.finish_s - o.arrival_s, 10 * step_s, 1e-9);
  }
}

TEST(cluster_simulation, a_step_of_several_threads_goes_at_the_pace_of_its_most_crowded_core) {
  // Two cores and a client keeping one of them busy. A one-thread step has a core of its own and
  // runs at full speed; a two-thread step shares a core with the client, and its threads meet
  // after every op, so it goes at half speed (processor sharing would say two thirds: 15 ms).
  const std::vector<planned_request> workload{{0.0, 16, 5}, {1.0, 16, 5}};
  simulated_cluster c = cluster_of(1);
  c.host.cores = 2;
  c.host.client_seconds_per_request = 1.0;
  c.host.threads_per_instance = 1;
  const simulation_result one_thread = simulate(c, workload);
  c.host.threads_per_instance = 2;
  const simulation_result two_threads = simulate(c, workload);
  for (size_t k = 0; k < workload.size(); ++k) {
    ASSERT_TRUE(one_thread.requests[k].ok()) << one_thread.requests[k].error;
    ASSERT_TRUE(two_threads.requests[k].ok()) << two_threads.requests[k].error;
    EXPECT_NEAR(one_thread.requests[k].ttft(), step_s, 1e-9);
    EXPECT_NEAR(two_threads.requests[k].ttft(), 2 * step_s, 1e-9);
    EXPECT_NEAR(two_threads.requests[k].finish_s - two_threads.requests[k].arrival_s, 10 * step_s, 1e-9);
  }
}

TEST(cluster_simulation, a_serving_stack_that_cannot_keep_up_delays_each_request_more_than_the_last) {
  // A request every 5 ms, and the stack spends 10 ms on each arrival (one thread, in order):
  // request k reaches the scheduler 10 (k + 1) ms in, whatever the steps cost. Without the
  // stack's cost the same requests wait for no more than a step or two.
  std::vector<planned_request> workload;
  for (int k = 0; k < 50; ++k) workload.push_back({0.005 * k, 16, 1});
  simulated_cluster c = cluster_of(1);
  c.step_times.mixed = step_cost{{0.001, 0, 0, 0, 0}, 1};
  const simulation_result free_stack = simulate(c, workload);
  c.host.cores = 2;
  c.host.stack_seconds_per_request = 0.010;
  const simulation_result costly_stack = simulate(c, workload);
  for (size_t k = 0; k < workload.size(); ++k) {
    ASSERT_TRUE(free_stack.requests[k].ok()) << free_stack.requests[k].error;
    ASSERT_TRUE(costly_stack.requests[k].ok()) << costly_stack.requests[k].error;
    EXPECT_LT(free_stack.requests[k].ttft(), 0.005);
    EXPECT_GE(costly_stack.requests[k].ttft(), 0.005 * static_cast<double>(k) + 0.010 - 1e-9) << "request " << k;
  }
  EXPECT_GT(costly_stack.requests.back().ttft(), 0.25);
}

TEST(cluster_simulation, a_stack_of_several_processes_works_on_as_many_jobs_at_once) {
  // Two requests at once, 10 ms of the stack's CPU each: one thread dispatches the second 10 ms
  // after the first, two threads both at 10 ms (on cores enough for all).
  const std::vector<planned_request> workload{{0.0, 16, 1}, {0.0, 16, 1}};
  simulated_cluster c = cluster_of(1);
  c.host.cores = 8;
  c.host.stack_seconds_per_request = 0.010;
  const simulation_result one = simulate(c, workload);
  c.host.stack_threads = 2;
  const simulation_result two = simulate(c, workload);
  for (const simulation_result* r : {&one, &two}) {
    for (const simulated_outcome& o : r->requests) ASSERT_TRUE(o.ok()) << o.error;
  }
  EXPECT_NEAR(one.requests[1].ttft() - one.requests[0].ttft(), 0.010, 1e-9);
  EXPECT_NEAR(two.requests[0].ttft(), two.requests[1].ttft(), 1e-9);
  EXPECT_NEAR(two.requests[1].ttft(), 0.010 + step_s, 1e-9);
  // Jobs of different sizes: a short one done behind a long one waits to retire and holds no
  // thread meanwhile (time moves on; it once stood still there).
  c.host.stack_seconds_per_token = 0.001;
  const simulation_result mixed = simulate(c, {{0.0, 16, 3}, {0.0, 16, 3}, {0.001, 16, 3}});
  for (const simulated_outcome& o : mixed.requests) {
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_EQ(o.output_tokens, 3);
    EXPECT_GT(o.finish_s, o.first_token_s);
  }
}

TEST(cluster_simulation, streamed_tokens_reach_the_client_after_the_stacks_work_on_them) {
  // 3 ms of the stack's CPU per token: each token reaches the client 3 ms after its step.
  simulated_cluster c = cluster_of(1);
  c.host.cores = 2;
  c.host.stack_seconds_per_token = 0.003;
  const simulation_result r = simulate(c, {{0.0, 16, 5}});
  const simulated_outcome& o = r.requests[0];
  ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_NEAR(o.first_token_s, step_s + 0.003, 1e-9);
  EXPECT_NEAR(o.finish_s, 5 * step_s + 0.003, 1e-9);
  EXPECT_EQ(o.output_tokens, 5);
}

TEST(cluster_simulation, impossible_clusters_and_unordered_workloads_are_refused) {
  EXPECT_THROW(simulate(cluster_of(0), {{0.0, 8, 2}}), std::invalid_argument);
  EXPECT_THROW(simulate(cluster_of(0, 1, 0), {{0.0, 8, 2}}), std::invalid_argument);
  EXPECT_THROW(simulate(cluster_of(1), {{1.0, 8, 2}, {0.5, 8, 2}}), std::invalid_argument);
  simulated_cluster negative_stack = cluster_of(1);
  negative_stack.host.cores = 2;
  negative_stack.host.stack_seconds_per_token = -0.001;
  EXPECT_THROW(simulate(negative_stack, {{0.0, 8, 2}}), std::invalid_argument);
  simulated_cluster no_threads = cluster_of(1);
  no_threads.host.cores = 2;
  no_threads.host.threads_per_instance = 0;
  EXPECT_THROW(simulate(no_threads, {{0.0, 8, 2}}), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
