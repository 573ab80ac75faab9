// The router's decisions without actors: load-based choice, prefix affinity, what it records of
// each request's stream, and what it hands back for a re-run when an instance is lost.

#include <gtest/gtest.h>

#include <algorithm>

#include "stages/engine_router.hpp"

namespace troupe {
namespace {

constexpr int block_size = 4;

schedule_request request(int64_t id, std::vector<int32_t> prompt) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_tokens = 8;
  return r;
}

std::vector<int32_t> prompt_of(int first, int length) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(first + i);
  return ids;
}

// A delta of the request's run `attempt` (routed::attempt: 0 its first, one more each re-run).
token_delta delta(int64_t id, std::vector<int32_t> tokens, bool finished = false, uint32_t attempt = 0) {
  token_delta d;
  d.request_id = id;
  d.token_ids = std::move(tokens);
  if (finished) d.finish = finish_reason::length;
  d.attempt = attempt;
  return d;
}

token_batch batch(std::vector<token_delta> deltas, engine_load load = {}) {
  token_batch b;
  b.timelines.resize(deltas.size());
  b.deltas = std::move(deltas);
  b.load = load;
  return b;
}

TEST(engine_router, no_instance_no_route) {
  engine_router router(block_size);
  EXPECT_FALSE(router.route(request(1, {1, 2})));
  const auto only = router.add_instance("a", engine_role::mixed, "Q4_K_M");
  EXPECT_EQ(router.instances().front().quantization, "Q4_K_M");
  ASSERT_TRUE(router.drain(only));
  EXPECT_FALSE(router.route(request(2, {1, 2}))) << "a draining instance takes no new request";
}

TEST(engine_router, queued_prompt_tokens_steer_new_requests_to_the_lighter_instance) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  const auto first = router.route(request(1, prompt_of(100, 30)));
  ASSERT_TRUE(first);
  const auto other = first->instance == a ? b : a;
  // The first one's 30 prompt tokens wait on its instance: the next requests go to the other
  // until it has as much queued.
  for (int64_t id = 2; id <= 4; ++id) {
    auto where = router.route(request(id, prompt_of(200 + int(id) * 10, 9)));
    ASSERT_TRUE(where);
    EXPECT_EQ(where->instance, other) << "request " << id;
  }
  const auto info = router.instances();
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[size_t(first->instance)].num_queued_prompt_tokens, 30);
  EXPECT_EQ(info[size_t(other)].num_queued_prompt_tokens, 27);
}

TEST(engine_router, a_finished_request_names_the_instance_that_ended_it) {
  // The access log's instance (doors/access_log.hpp) is the router's id, as in traces.
  engine_router router(block_size);
  router.add_instance("a");
  router.add_instance("b");
  ASSERT_TRUE(router.route(request(1, prompt_of(100, 30))));  // to one of them
  const auto second = router.route(request(2, prompt_of(300, 9)));
  ASSERT_TRUE(second);
  const auto b = second->instance;  // the other one
  token_batch out = router.on_tokens(b, batch({delta(2, {7}), delta(2, {8}, true)}));
  ASSERT_EQ(out.timelines.size(), 2u);
  EXPECT_EQ(out.timelines[0].instance, -1);  // a delta on the way names none
  EXPECT_EQ(out.timelines[1].instance, b);
}

TEST(engine_router, equal_instances_take_turns) {
  engine_router router(block_size);
  router.add_instance("a");
  router.add_instance("b");
  int on_a = 0;
  for (int64_t id = 1; id <= 10; ++id) {
    auto where = router.route(request(id, {7}));
    ASSERT_TRUE(where);
    // Finished at once, so both stay equally loaded.
    router.on_tokens(where->instance, batch({delta(id, {1}, true)}));
    on_a += where->instance == 0;
  }
  EXPECT_EQ(on_a, 5);
}

// Routes `count` prompts of 30 distinct tokens that never finish; how many went to `instance`.
int routed_to(engine_router& router, engine_instance_id instance, int count) {
  int on = 0;
  for (int64_t id = 1; id <= count; ++id) {
    auto where = router.route(request(id, prompt_of(static_cast<int>(100 * id), 30)));
    if (!where) ADD_FAILURE() << "request " << id << " was not routed";
    on += where && where->instance == instance;
  }
  return on;
}

TEST(engine_router, a_slower_instance_s_queue_counts_for_more_by_its_step_time_model) {
  // b's step-time model says a prompt token costs three times what it costs on a: with prompts
  // queued on both (none finishes), a takes three of every four, where equal instances alternate.
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  router.set_load(a, engine_load{64, 64, 0, 0, 1e-4});
  router.set_load(b, engine_load{64, 64, 0, 0, 3e-4});
  EXPECT_EQ(routed_to(router, a, 8), 6);
  // An instance that has not measured enough steps counts as the others' mean: b unknown and
  // a alone known, they weigh alike and alternate again.
  engine_router fresh(block_size);
  const auto c = fresh.add_instance("c");
  const auto d = fresh.add_instance("d");
  fresh.set_load(c, engine_load{64, 64, 0, 0, 1e-4});
  fresh.set_load(d, engine_load{64, 64, 0, 0, 0});
  EXPECT_EQ(routed_to(fresh, c, 8), 4);
}

TEST(engine_router, a_pool_reported_full_is_avoided) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  // b reports 1 free block of 64, a 60: a prompt of 3 blocks would wait on b.
  router.on_tokens(b, batch({}, engine_load{1, 64, 0, 0}));
  router.on_tokens(a, batch({}, engine_load{60, 64, 0, 0}));
  // By queued tokens alone these would alternate; b's pool keeps every one of them on a.
  for (int i = 0; i < 4; ++i) {
    auto where = router.route(request(30 + i, prompt_of(50 + i * 20, 12)));
    ASSERT_TRUE(where);
    EXPECT_EQ(where->instance, a) << "b has no room for 3 blocks";
  }
  // A one-block prompt fits b: it goes there, a having the queue.
  EXPECT_EQ(router.route(request(40, {1}))->instance, b);
}

TEST(engine_router, a_new_instance_is_judged_by_its_pool_before_its_first_batch) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  router.set_load(a, engine_load{0, 64, 0, 0});  // a's stats at join: a full pool
  router.set_load(b, engine_load{64, 64, 0, 0});
  for (int64_t id = 1; id <= 3; ++id) EXPECT_EQ(router.route(request(id, prompt_of(1, 8)))->instance, b);
  EXPECT_EQ(router.instances()[size_t(a)].load.num_total_blocks, 64);
}

TEST(engine_router, a_known_first_block_goes_back_to_its_instance) {
  engine_router router(block_size);
  router.add_instance("a");
  router.add_instance("b");
  const std::vector<int32_t> shared = {5, 6, 7, 8, 9, 10};  // more than one block
  auto first = router.route(request(1, shared));
  ASSERT_TRUE(first);
  router.on_tokens(first->instance, batch({delta(1, {1}, true)}));
  for (int64_t id = 2; id <= 6; ++id) {
    auto where = router.route(request(id, shared));
    ASSERT_TRUE(where);
    EXPECT_EQ(where->instance, first->instance) << "request " << id << " shares the cached first block";
    router.on_tokens(where->instance, batch({delta(id, {1}, true)}));
  }
}

TEST(engine_router, records_the_stream_and_hands_back_re_runs_when_an_instance_is_lost) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  auto r1 = router.route(request(1, {1, 2, 3}));
  auto r2 = router.route(request(2, {4, 5, 6}));
  ASSERT_TRUE(r1 && r2);
  ASSERT_NE(r1->instance, r2->instance);
  const auto lost = r1->instance;
  const auto kept = r2->instance;
  // Request 1 streams 3 tokens on the instance that will be lost; a batch from the wrong
  // instance is no part of its stream.
  token_batch forwarded = router.on_tokens(lost, batch({delta(1, {11, 12})}));
  EXPECT_EQ(forwarded.deltas.size(), 1u);
  EXPECT_TRUE(router.on_tokens(kept, batch({delta(1, {99})})).deltas.empty());
  router.on_tokens(lost, batch({delta(1, {13})}));

  std::vector<schedule_request> reruns = router.remove_instance(lost);
  ASSERT_EQ(reruns.size(), 1u);
  EXPECT_EQ(reruns[0].request_id, 1);
  EXPECT_EQ(reruns[0].prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(reruns[0].resumed_output_ids, (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(reruns[0].sampling.max_tokens, 8) << "the budget is the whole request's: the engine counts resumed tokens";

  auto again = router.route(reruns[0]);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->instance, kept);
  EXPECT_EQ(router.instance_of(1), kept);
  // A late batch of the lost instance changes nothing; the new one's tokens continue the stream.
  EXPECT_TRUE(router.on_tokens(lost, batch({delta(1, {50})})).deltas.empty());
  EXPECT_EQ(again->attempt, 1u) << "its second run";
  router.on_tokens(kept, batch({delta(1, {14}, false, again->attempt)}));
  reruns = router.remove_instance(kept);
  ASSERT_EQ(reruns.size(), 2u);
  EXPECT_EQ(reruns[0].request_id, 1) << "oldest first";
  EXPECT_EQ(reruns[0].resumed_output_ids, (std::vector<int32_t>{11, 12, 13, 14}));
  EXPECT_TRUE(reruns[1].resumed_output_ids.empty());
  EXPECT_FALSE(router.route(reruns[0])) << "no instance left";
  router.drop(1);
  router.drop(2);
  EXPECT_EQ(router.num_requests(), 0u);
  (void)a;
  (void)b;
}

TEST(engine_router, finished_and_failed_requests_are_forgotten_and_their_load_released) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  router.route(request(1, prompt_of(1, 10)));
  router.route(request(2, prompt_of(1, 6)));
  router.route(request(3, prompt_of(1, 2)));
  EXPECT_EQ(router.instances()[0].num_queued_prompt_tokens, 18);
  router.on_tokens(a, batch({delta(1, {7})}));  // started: no longer queued
  EXPECT_EQ(router.instances()[0].num_queued_prompt_tokens, 8);
  token_batch failed;
  failed.failures.push_back(request_failed{2, error_code::internal, "step failed"});
  EXPECT_EQ(router.on_tokens(a, failed).failures.size(), 1u);
  EXPECT_TRUE(router.on_refusal(a, request_failed{3, error_code::overloaded, "full"}));
  EXPECT_FALSE(router.on_refusal(a, request_failed{3, error_code::overloaded, "again"})) << "already forgotten";
  router.on_tokens(a, batch({delta(1, {8}, true)}));
  EXPECT_EQ(router.num_requests(), 0u);
  EXPECT_EQ(router.instances()[0].num_requests, 0);
  EXPECT_EQ(router.instances()[0].num_queued_prompt_tokens, 0);
}

TEST(engine_router, a_draining_instance_is_drained_when_its_last_request_ends) {
  engine_router router(block_size);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  router.route(request(1, {1}));
  router.route(request(2, {1}));
  const auto on_a = router.instance_of(1) == a ? 1 : 2;
  ASSERT_TRUE(router.drain(a));
  EXPECT_FALSE(router.drained(a));
  for (int64_t id = 3; id <= 5; ++id) EXPECT_EQ(router.route(request(id, {1}))->instance, b);
  router.on_tokens(a, batch({delta(on_a, {1}, true)}));
  EXPECT_TRUE(router.drained(a));
  EXPECT_FALSE(router.drain(42));
}

TEST(engine_router, draining_a_node_drains_each_active_instance_there_and_nothing_elsewhere) {
  engine_router router(block_size);
  const auto a1 = router.add_instance("a");
  const auto b = router.add_instance("b");
  const auto a2 = router.add_instance("a");
  EXPECT_EQ(router.drain_node("a"), (std::vector<engine_instance_id>{a1, a2}));
  for (const engine_instance_info& info : router.instances()) {
    EXPECT_EQ(info.state, info.id == b ? engine_state::active : engine_state::draining) << info.id;
  }
  for (int64_t id = 1; id <= 4; ++id) EXPECT_EQ(router.route(request(id, {1}))->instance, b);
  EXPECT_TRUE(router.drained(a1)) << "idle: it may stop at once";
  EXPECT_TRUE(router.drain_node("a").empty()) << "draining already";
  EXPECT_TRUE(router.drain_node("nowhere").empty());
  // Taken out past its deadline (the router actor's timer), a draining instance's unfinished
  // requests come back to be re-run elsewhere.
  router.add_instance("c");
  EXPECT_EQ(router.drain_node("b"), std::vector<engine_instance_id>{b});
  std::vector<int64_t> rerun_ids;
  for (const schedule_request& r : router.remove_instance(b)) rerun_ids.push_back(r.request_id);
  std::sort(rerun_ids.begin(), rerun_ids.end());
  EXPECT_EQ(rerun_ids, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(engine_router, an_abort_that_overtakes_its_request_is_applied_when_it_comes) {
  engine_router router(block_size);
  router.add_instance("a");
  EXPECT_FALSE(router.instance_of(9));
  router.abort_unrouted(9);
  auto where = router.route(request(9, {1}));
  ASSERT_TRUE(where);
  EXPECT_TRUE(where->aborted_early);
  EXPECT_FALSE(router.route(request(10, {1}))->aborted_early);
}

// Failover wait ([cluster] failover_wait_ms): while no instance takes requests they wait, bounded.
constexpr timestamp_ns ms = 1000000;

failover_wait_settings wait_for(int64_t bound_ms, size_t max_waiting = 16) {
  failover_wait_settings wait;
  wait.bound = std::chrono::milliseconds(bound_ms);
  wait.max_waiting = max_waiting;
  return wait;
}

TEST(engine_router_failover_wait, requests_of_the_last_lost_instance_and_new_ones_wait_and_run_on_the_next_to_join) {
  engine_router router(block_size, wait_for(1000));
  const auto lost = router.add_instance("a");
  ASSERT_TRUE(router.route(request(1, prompt_of(10, 6))));
  router.on_tokens(lost, batch({delta(1, {7, 8})}));
  std::vector<schedule_request> reruns = router.remove_instance(lost);
  ASSERT_EQ(reruns.size(), 1u);
  // Nothing left: the re-run waits, and so does a new request that comes meanwhile.
  ASSERT_FALSE(router.route(reruns[0]));
  EXPECT_TRUE(router.wait_for_instance(reruns[0], 0));
  ASSERT_FALSE(router.route(request(2, prompt_of(40, 3))));
  EXPECT_TRUE(router.wait_for_instance(request(2, prompt_of(40, 3)), 5 * ms));
  EXPECT_TRUE(router.is_waiting(1));
  EXPECT_TRUE(router.is_waiting(2));
  EXPECT_EQ(router.num_waiting(), 2u);
  EXPECT_EQ(router.next_wait_deadline(), 1000 * ms);
  router.expire_waiting(999 * ms);  // not yet
  EXPECT_TRUE(router.take_commands().failures.empty());

  const auto back = router.add_instance("a");
  EXPECT_EQ(router.num_waiting(), 0u);
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.reruns.size(), 2u) << "every waiting request comes back to be routed";
  EXPECT_EQ(commands.reruns[0].request_id, 1) << "oldest first";
  EXPECT_EQ(commands.reruns[0].resumed_output_ids, (std::vector<int32_t>{7, 8})) << "what the client already has";
  EXPECT_EQ(commands.reruns[1].request_id, 2);
  EXPECT_TRUE(commands.reruns[1].resumed_output_ids.empty());
  std::vector<uint32_t> attempts;
  for (const schedule_request& again : commands.reruns) {
    const auto where = router.route(again);
    ASSERT_TRUE(where);
    EXPECT_EQ(where->instance, back);
    attempts.push_back(where->attempt);
  }
  EXPECT_EQ(attempts, (std::vector<uint32_t>{1, 0})) << "request 1 runs a second time, request 2 a first";
  // The re-run's stream goes on where it was: tokens from the new instance follow 7, 8.
  const token_batch out = router.on_tokens(back, batch({delta(1, {9}, true, 1), delta(2, {3})}));
  ASSERT_EQ(out.deltas.size(), 2u);
  EXPECT_EQ(router.num_requests(), 1u) << "request 1 finished, request 2 runs";
  router.expire_waiting(2000 * ms);
  EXPECT_TRUE(router.take_commands().failures.empty()) << "nothing waits any more";
}

TEST(engine_router_failover_wait, past_the_bound_a_waiting_request_fails_unavailable_and_is_forgotten) {
  engine_router router(block_size, wait_for(1000));
  const auto lost = router.add_instance("a");
  ASSERT_TRUE(router.route(request(1, prompt_of(10, 6))));
  router.on_tokens(lost, batch({delta(1, {7})}));
  std::vector<schedule_request> reruns = router.remove_instance(lost);
  ASSERT_EQ(reruns.size(), 1u);
  ASSERT_TRUE(router.wait_for_instance(reruns[0], 0));
  ASSERT_TRUE(router.wait_for_instance(request(2, prompt_of(40, 3)), 500 * ms));
  router.expire_waiting(1000 * ms);
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.failures.size(), 1u) << "only the one whose bound passed";
  EXPECT_EQ(commands.failures[0].request_id, 1);
  EXPECT_EQ(commands.failures[0].code, error_code::unavailable);
  EXPECT_NE(commands.failures[0].message.find("no engine instance is available"), std::string::npos);
  EXPECT_NE(commands.failures[0].message.find("failover_wait_ms (1000 ms)"), std::string::npos);
  EXPECT_EQ(router.next_wait_deadline(), 1500 * ms);
  router.expire_waiting(1500 * ms);
  EXPECT_EQ(router.take_commands().failures.size(), 1u);
  EXPECT_FALSE(router.next_wait_deadline());
  EXPECT_EQ(router.num_requests(), 0u) << "the re-run's record went with it";
  router.add_instance("b");
  EXPECT_TRUE(router.take_commands().reruns.empty()) << "a failed request is not run when an instance comes";
}

TEST(engine_router_failover_wait, one_timer_at_a_time_set_for_the_oldest_waiting_request) {
  engine_router router(block_size, wait_for(1000));
  EXPECT_FALSE(router.wait_timer_to_set()) << "nothing waits";
  ASSERT_TRUE(router.wait_for_instance(request(1, prompt_of(10, 3)), 0));
  EXPECT_EQ(router.wait_timer_to_set(), 1000 * ms);
  ASSERT_TRUE(router.wait_for_instance(request(2, prompt_of(20, 3)), 300 * ms));
  EXPECT_FALSE(router.wait_timer_to_set()) << "one is set already, for the oldest";
  router.wait_timer_fired();
  router.expire_waiting(1000 * ms);
  EXPECT_EQ(router.take_commands().failures.size(), 1u);
  EXPECT_EQ(router.wait_timer_to_set(), 1300 * ms) << "the next is set for the one left";
  router.wait_timer_fired();
  router.expire_waiting(1300 * ms);
  EXPECT_FALSE(router.wait_timer_to_set()) << "none waits any more";
}

TEST(engine_router_failover_wait, an_abort_or_a_stop_ends_a_waiting_request_with_its_final_delta) {
  engine_router router(block_size, wait_for(1000));
  ASSERT_TRUE(router.wait_for_instance(request(1, prompt_of(10, 6)), 0));
  schedule_request resumed = request(2, prompt_of(20, 3));
  resumed.resumed_output_ids = {4, 5};
  ASSERT_TRUE(router.wait_for_instance(resumed, 0));
  EXPECT_TRUE(router.end_waiting(1, finish_reason::abort));
  EXPECT_TRUE(router.end_waiting(2, finish_reason::stop));
  EXPECT_FALSE(router.end_waiting(1, finish_reason::abort)) << "ended once";
  EXPECT_FALSE(router.end_waiting(3, finish_reason::abort)) << "never waited";
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.ended.deltas.size(), 2u);
  ASSERT_EQ(commands.ended.timelines.size(), 2u);
  EXPECT_EQ(commands.ended.deltas[0].request_id, 1);
  EXPECT_EQ(commands.ended.deltas[0].finish, finish_reason::abort);
  EXPECT_TRUE(commands.ended.deltas[0].token_ids.empty()) << "no token the client has not had";
  ASSERT_TRUE(commands.ended.deltas[0].metrics);
  EXPECT_EQ(commands.ended.deltas[0].metrics->num_prompt_tokens, 6);
  EXPECT_EQ(commands.ended.deltas[1].finish, finish_reason::stop);
  EXPECT_EQ(commands.ended.deltas[1].metrics->num_output_tokens, 2);
  EXPECT_EQ(router.num_waiting(), 0u);
  router.add_instance("a");
  EXPECT_TRUE(router.take_commands().reruns.empty()) << "an ended request is not run when an instance comes";
  router.expire_waiting(5000 * ms);
  EXPECT_TRUE(router.take_commands().failures.empty());
}

TEST(engine_router_failover_wait, beyond_the_cap_or_with_no_bound_a_request_is_refused_at_once) {
  engine_router capped(block_size, wait_for(1000, 2));
  EXPECT_TRUE(capped.wait_for_instance(request(1, {1}), 0));
  EXPECT_TRUE(capped.wait_for_instance(request(2, {1}), 0));
  EXPECT_FALSE(capped.wait_for_instance(request(3, {1}), 0)) << "two wait already";
  EXPECT_TRUE(capped.wait_for_instance(request(2, {1}), 0)) << "the same request (tokenized twice) waits once";
  EXPECT_EQ(capped.num_waiting(), 2u);
  EXPECT_FALSE(capped.is_waiting(3));
  EXPECT_EQ(capped.waiting_requests(), (std::vector<int64_t>{1, 2}));

  engine_router at_once(block_size);  // failover_wait_ms = 0: today's behaviour
  const auto only = at_once.add_instance("a");
  ASSERT_TRUE(at_once.route(request(1, {1, 2})));
  std::vector<schedule_request> reruns = at_once.remove_instance(only);
  ASSERT_EQ(reruns.size(), 1u);
  EXPECT_FALSE(at_once.wait_for_instance(reruns[0], 0));
  EXPECT_EQ(at_once.num_requests(), 0u) << "refused: the caller fails it, nothing is kept";
  EXPECT_EQ(at_once.num_waiting(), 0u);
}

}  // namespace
}  // namespace troupe
