// The router's halves of a disaggregated request: a pair when a prefill and a decode instance
// are active, the hand-over of the first token, quiet aborts of the other half on any loss or
// failed transfer, and the stale hand-off of an earlier attempt dropped.

#include <gtest/gtest.h>

#include <map>

#include "stages/engine_router.hpp"

namespace troupe {
namespace {

schedule_request request(int64_t id) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = {5, 6, 7, 8, 9, 10};
  r.sampling.max_tokens = 8;
  return r;
}

token_batch batch(token_delta d) {
  token_batch b;
  b.deltas.push_back(std::move(d));
  b.timelines.resize(1);
  return b;
}

token_delta handed_off(int64_t id, int32_t token, uint64_t transfer) {
  token_delta d;
  d.request_id = id;
  d.token_ids = {token};
  d.handed_off = true;
  d.kv_transfer_id = transfer;
  return d;
}

// A delta of the request's run `attempt` (routed::attempt: 0 its first, one more each re-run).
token_delta plain(int64_t id, int32_t token, uint32_t attempt = 0) {
  token_delta d;
  d.request_id = id;
  d.token_ids = {token};
  d.attempt = attempt;
  return d;
}

// `lost` goes: the request's one re-run, after the router aborted its half on `survivor`, routed
// again, whole, on `survivor` (the only instance left).
struct re_run {
  schedule_request request;
  engine_router::routed where;
};
re_run run_again_on(engine_router& router, engine_instance_id lost, engine_instance_id survivor) {
  const std::vector<schedule_request> reruns = router.remove_instance(lost);
  EXPECT_EQ(reruns.size(), 1u);
  const router_commands commands = router.take_commands();
  EXPECT_EQ(commands.aborts, (std::vector<std::pair<engine_instance_id, int64_t>>{{survivor, 1}}));
  if (reruns.empty()) return {};
  const auto again = router.route(reruns[0]);
  EXPECT_TRUE(again);
  if (!again) return {reruns[0], {}};
  EXPECT_EQ(again->instance, survivor);
  EXPECT_FALSE(again->decode);
  return {reruns[0], *again};
}

TEST(engine_router_disagg, a_pair_prefills_hands_over_and_decodes) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto where = router.route(request(1));
  ASSERT_TRUE(where);
  EXPECT_EQ(where->instance, p);
  ASSERT_TRUE(where->decode);
  EXPECT_EQ(*where->decode, d);
  EXPECT_NE(where->transfer_id, 0u);
  EXPECT_EQ(router.holders_of(1), (std::vector<engine_instance_id>{p, d}));
  EXPECT_EQ(router.on_kv_ready(d, kv_ready_msg{1, where->transfer_id, "tcp://x:1", ""}), p);
  EXPECT_FALSE(router.on_kv_ready(p, kv_ready_msg{1, where->transfer_id, "tcp://x:1", ""}))
      << "not from the decode half";

  const token_batch out = router.on_tokens(p, batch(handed_off(1, 42, where->transfer_id)));
  ASSERT_EQ(out.deltas.size(), 1u);
  EXPECT_FALSE(out.deltas[0].handed_off) << "downstream it is an ordinary delta";
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.handovers.size(), 1u);
  EXPECT_EQ(commands.handovers[0].first, d);
  EXPECT_EQ(commands.handovers[0].second.token_ids, std::vector<int32_t>{42});
  EXPECT_EQ(router.instance_of(1), d);
  EXPECT_EQ(router.on_tokens(d, batch(plain(1, 43))).deltas.size(), 1u);
}

TEST(engine_router_disagg, without_a_prefill_instance_a_decode_instance_computes_the_request_whole) {
  engine_router router(4);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto where = router.route(request(1));
  ASSERT_TRUE(where);
  EXPECT_EQ(where->instance, d);
  EXPECT_FALSE(where->decode);
}

TEST(engine_router_disagg, a_lost_decode_half_aborts_the_prefill_half_and_its_stale_hand_off_is_dropped) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto first = router.route(request(1));
  ASSERT_TRUE(first && first->decode);
  // Run again: only the prefill instance is left, so it computes the request whole.
  const re_run again = run_again_on(router, d, p);
  ASSERT_FALSE(HasFailure());
  // The first attempt's hand-off, sent before the abort reached it, is not this attempt's token.
  EXPECT_TRUE(router.on_tokens(p, batch(handed_off(1, 42, first->transfer_id))).deltas.empty());
  const token_batch out = router.on_tokens(p, batch(plain(1, 42, again.where.attempt)));
  ASSERT_EQ(out.deltas.size(), 1u);
  EXPECT_TRUE(router.take_commands().handovers.empty());
}

// The prefill half is lost after its hand-off but before the decode half has the whole KV: the
// decode half is aborted and the request runs again whole on the decode instance, the only one
// left. What the aborted decode half sent before the abort reached it comes from that same
// instance; its tokens are not the new run's (which continues from the tokens the router had),
// and forwarding them repeated text to the client (disagg_failover_e2e, once in a CI run).
TEST(engine_router_disagg, a_re_run_on_the_aborted_halfs_instance_drops_what_that_half_still_sends) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto first = router.route(request(1));
  ASSERT_TRUE(first && first->decode);
  EXPECT_EQ(first->attempt, 0u);
  ASSERT_TRUE(router.on_kv_ready(d, kv_ready_msg{1, first->transfer_id, "tcp://x:1", ""}));
  router.on_tokens(p, batch(handed_off(1, 42, first->transfer_id)));
  EXPECT_EQ(router.instance_of(1), d);
  (void)router.take_commands();

  // Its KV had not landed: it runs again, whole, on the decode instance.
  const re_run again = run_again_on(router, p, d);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(again.request.resumed_output_ids, (std::vector<int32_t>{42}));
  EXPECT_EQ(again.where.attempt, 1u);

  // The aborted half's late tokens, from the instance the request now runs on, are dropped.
  EXPECT_TRUE(router.on_tokens(d, batch(plain(1, 43, first->attempt))).deltas.empty());
  const token_batch out = router.on_tokens(d, batch(plain(1, 43, again.where.attempt)));
  ASSERT_EQ(out.deltas.size(), 1u);
  EXPECT_EQ(out.deltas[0].token_ids, (std::vector<int32_t>{43}));
}

// A client's abort reaches both halves; the decode half may end the request (finish abort)
// before the prefill half's first token comes. That end is the request's one terminal reply: it
// is forwarded, the prefill half is aborted, and its late hand-off is dropped, not handed to a
// decode half that no longer knows the request (issue 25: a first token and no final reply).
TEST(engine_router_disagg, the_decode_halfs_end_before_the_hand_off_is_the_requests_terminal_reply) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto where = router.route(request(1));
  ASSERT_TRUE(where && where->decode);
  token_delta aborted;
  aborted.request_id = 1;
  aborted.finish = finish_reason::abort;
  const token_batch out = router.on_tokens(d, batch(aborted));
  ASSERT_EQ(out.deltas.size(), 1u) << "the decode half's end was dropped";
  EXPECT_EQ(out.deltas[0].finish, finish_reason::abort);
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.aborts.size(), 1u);
  EXPECT_EQ(commands.aborts[0], std::make_pair(p, int64_t{1}));
  EXPECT_EQ(router.num_requests(), 0u);
  // The prefill half's first token, sent before the abort reached it: nothing more goes out.
  EXPECT_TRUE(router.on_tokens(p, batch(handed_off(1, 42, where->transfer_id))).deltas.empty());
  EXPECT_TRUE(router.take_commands().handovers.empty());
  // Every instance is idle again.
  for (const engine_instance_info& info : router.instances()) EXPECT_EQ(info.num_requests, 0) << info.id;

  // The same for a failure the decode half reports before the hand-off.
  const auto second = router.route(request(2));
  ASSERT_TRUE(second && second->decode);
  token_batch failed;
  failed.failures.push_back(request_failed{2, error_code::internal, "no blocks"});
  EXPECT_EQ(router.on_tokens(d, failed).failures.size(), 1u);
  commands = router.take_commands();
  ASSERT_EQ(commands.aborts.size(), 1u);
  EXPECT_EQ(commands.aborts[0], std::make_pair(p, int64_t{2}));
  EXPECT_EQ(router.num_requests(), 0u);
}

TEST(engine_router_disagg, a_failed_transfer_runs_again_then_ends_with_the_reason) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  auto where = router.route(request(1));
  for (int attempt = 1; attempt < engine_router::max_transfer_attempts; ++attempt) {
    router.on_kv_failed(d, kv_failed_msg{1, where->transfer_id, "its deadline passed"});
    router_commands commands = router.take_commands();
    ASSERT_EQ(commands.reruns.size(), 1u) << attempt;
    EXPECT_EQ(commands.aborts, (std::vector<std::pair<engine_instance_id, int64_t>>{{p, 1}}));
    where = router.route(commands.reruns[0]);
    ASSERT_TRUE(where && where->decode);
  }
  router.on_kv_failed(d, kv_failed_msg{1, where->transfer_id, "its deadline passed"});
  router_commands commands = router.take_commands();
  EXPECT_TRUE(commands.reruns.empty());
  ASSERT_EQ(commands.failures.size(), 1u);
  EXPECT_NE(commands.failures[0].message.find("its deadline passed"), std::string::npos);
  EXPECT_EQ(router.num_requests(), 0u);
}

// The prefill half's sender gave the transfer up: the decode half would wait for its own
// deadline, so the router aborts it now (and the prefill half, when it still holds the request)
// and runs the request again; a stale report (an earlier attempt, another instance) is ignored.
TEST(engine_router_disagg, a_transfer_the_prefill_side_gave_up_runs_again_at_once) {
  engine_router router(4);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto where = router.route(request(1));
  router.on_tokens(p, batch(handed_off(1, 42, where->transfer_id)));
  router.on_kv_send_failed(d, kv_failed_msg{0, where->transfer_id, "not the prefill half"});
  router.on_kv_send_failed(p, kv_failed_msg{0, where->transfer_id + 1, "another transfer"});
  EXPECT_TRUE(router.take_commands().reruns.empty());

  router.on_kv_send_failed(p, kv_failed_msg{0, where->transfer_id, "its deadline passed (no ready)"});
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.reruns.size(), 1u);
  EXPECT_EQ(commands.reruns[0].resumed_output_ids, std::vector<int32_t>{42}) << "the streamed token goes on";
  EXPECT_EQ(commands.aborts, (std::vector<std::pair<engine_instance_id, int64_t>>{{d, 1}}))
      << "the decode half, past the hand-off the only holder";

  // Before the hand-off the prefill half still holds it: both halves go.
  const auto again = router.route(commands.reruns[0]);
  ASSERT_TRUE(again && again->decode);
  router.on_kv_send_failed(p, kv_failed_msg{0, again->transfer_id, "the peer refused it"});
  commands = router.take_commands();
  ASSERT_EQ(commands.reruns.size(), 1u);
  EXPECT_EQ(commands.aborts, (std::vector<std::pair<engine_instance_id, int64_t>>{{p, 1}, {d, 1}}));
}

// Pair admission: a decode instance whose oldest request has waited past the bound for its
// blocks takes no new pair; with none left a request is refused as overloaded before any work
// is spent on it, and admission resumes once reservations catch up.
constexpr timestamp_ns ms = 1'000'000;

// Any backlog counts here; the default's minimum has a test of its own.
engine_router admitting_router(int bound_ms) {
  return engine_router(4, {}, pair_admission_settings{std::chrono::milliseconds(bound_ms), 0});
}

TEST(engine_router_disagg, a_decode_side_behind_its_reservations_refuses_new_pairs_as_overloaded) {
  engine_router router = admitting_router(5000);
  const auto p = router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  const auto first = router.route(request(1), 0);
  ASSERT_TRUE(first && first->decode);
  ASSERT_TRUE(router.route(request(2), 1000 * ms)) << "its oldest has waited 1 s: within the bound";
  ASSERT_TRUE(router.route(request(3), 5000 * ms)) << "exactly the bound is still within it";
  EXPECT_EQ(router.instances()[d].num_awaiting_blocks, 3);

  EXPECT_FALSE(router.route(request(4), 5001 * ms));
  EXPECT_EQ(router.route_error_code(), error_code::overloaded);
  EXPECT_NE(router.route_error().find("waited 5001 ms for KV blocks"), std::string::npos) << router.route_error();
  EXPECT_NE(router.route_error().find("reservation_wait_ms (5000 ms)"), std::string::npos) << router.route_error();
  EXPECT_FALSE(router.instance_of(4)) << "a refused request is recorded nowhere";
  EXPECT_EQ(router.num_overload_refusals(), 1) << "counted for /metrics";
  EXPECT_EQ(router.instances()[p].num_requests, 3) << "nor charged to the prefill side";

  // Under load the prefill half's first token comes before the decode half's blocks: the
  // hand-off does not end the wait.
  router.on_tokens(p, batch(handed_off(1, 42, first->transfer_id)));
  EXPECT_EQ(router.instance_of(1), d);
  EXPECT_EQ(router.instances()[d].num_awaiting_blocks, 3);
  EXPECT_FALSE(router.route(request(4), 5001 * ms)) << "still behind";

  // The decode side reserves the oldest: the next oldest has waited 4 s, so it takes pairs again.
  ASSERT_TRUE(router.on_kv_ready(d, kv_ready_msg{1, first->transfer_id, "tcp://x:1", ""}));
  EXPECT_EQ(router.instances()[d].num_awaiting_blocks, 2);
  const auto fifth = router.route(request(5), 5001 * ms);
  ASSERT_TRUE(fifth && fifth->decode);
  EXPECT_EQ(*fifth->decode, d);
}

TEST(engine_router_disagg, a_few_requests_waiting_past_the_bound_are_a_slow_moment_not_a_backlog) {
  engine_router router(4, {}, pair_admission_settings{std::chrono::milliseconds(100)});
  router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  for (int64_t id = 1; id <= 16; ++id) ASSERT_TRUE(router.route(request(id), 0)) << id;
  EXPECT_EQ(router.instances()[d].num_awaiting_blocks, 16);
  ASSERT_TRUE(router.route(request(17), 200 * ms)) << "16 waiting: the default's minimum backlog";
  EXPECT_FALSE(router.route(request(18), 200 * ms)) << "17 waiting past the bound: behind";
  EXPECT_EQ(router.route_error_code(), error_code::overloaded);
}

TEST(engine_router_disagg, a_pair_goes_to_the_decode_instance_that_keeps_up) {
  engine_router router = admitting_router(100);
  router.add_instance("p", engine_role::prefill);
  const auto d1 = router.add_instance("d1", engine_role::decode);
  const auto d2 = router.add_instance("d2", engine_role::decode);
  std::map<engine_instance_id, int> pairs;
  for (int64_t id = 1; id <= 4; ++id) {
    const auto where = router.route(request(id), 0);
    ASSERT_TRUE(where && where->decode);
    ++pairs[*where->decode];
    // d2 reserves everything it is sent; d1 nothing, and falls behind.
    if (*where->decode == d2) {
      ASSERT_TRUE(router.on_kv_ready(d2, kv_ready_msg{id, where->transfer_id, "", ""}));
    }
  }
  EXPECT_EQ(pairs[d1], 2);
  EXPECT_EQ(pairs[d2], 2);
  for (int64_t id = 5; id <= 8; ++id) {
    const auto where = router.route(request(id), 101 * ms);
    ASSERT_TRUE(where && where->decode) << id;
    EXPECT_EQ(*where->decode, d2) << "d1's oldest has waited past the bound";
    router.on_kv_ready(d2, kv_ready_msg{id, where->transfer_id, "", ""});
  }
}

TEST(engine_router_disagg, a_refusal_for_a_decode_side_behind_never_computes_the_request_whole_there) {
  engine_router router = admitting_router(100);
  router.add_instance("p", engine_role::prefill);
  router.add_instance("d", engine_role::decode);
  ASSERT_TRUE(router.route(request(1), 0));
  EXPECT_FALSE(router.route(request(2), 200 * ms)) << "no mixed instance: refused";
  EXPECT_EQ(router.route_error_code(), error_code::overloaded);
  const auto m = router.add_instance("m", engine_role::mixed);
  const auto whole = router.route(request(3), 200 * ms);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->instance, m) << "a mixed instance takes it whole";
  EXPECT_FALSE(whole->decode);
}

TEST(engine_router_disagg, a_re_run_pair_waits_for_its_blocks_from_when_it_was_routed_again) {
  engine_router router = admitting_router(100);
  router.add_instance("p", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  auto where = router.route(request(1), 0);
  router.on_kv_failed(d, kv_failed_msg{1, where->transfer_id, "its deadline passed"});
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.reruns.size(), 1u);
  EXPECT_EQ(router.instances()[d].num_awaiting_blocks, 0) << "the failed attempt waits no more";
  ASSERT_TRUE(router.route(commands.reruns[0], 1000 * ms));
  EXPECT_TRUE(router.route(request(2), 1050 * ms)) << "the re-run has waited 50 ms, not 1050";
}

}  // namespace
}  // namespace troupe
