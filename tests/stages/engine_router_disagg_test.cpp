// The router's halves of a disaggregated request: a pair when a prefill and a decode instance
// are active, the hand-over of the first token, quiet aborts of the other half on any loss or
// failed transfer, and the stale hand-off of an earlier attempt dropped.

#include <gtest/gtest.h>

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

token_delta plain(int64_t id, int32_t token) {
  token_delta d;
  d.request_id = id;
  d.token_ids = {token};
  return d;
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
  const std::vector<schedule_request> reruns = router.remove_instance(d);
  ASSERT_EQ(reruns.size(), 1u);
  router_commands commands = router.take_commands();
  ASSERT_EQ(commands.aborts.size(), 1u);
  EXPECT_EQ(commands.aborts[0], std::make_pair(p, int64_t{1}));
  // Run again: only the prefill instance is left, so it computes the request whole.
  const auto again = router.route(reruns[0]);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->instance, p);
  EXPECT_FALSE(again->decode);
  // The first attempt's hand-off, sent before the abort reached it, is not this attempt's token.
  EXPECT_TRUE(router.on_tokens(p, batch(handed_off(1, 42, first->transfer_id))).deltas.empty());
  const token_batch out = router.on_tokens(p, batch(plain(1, 42)));
  ASSERT_EQ(out.deltas.size(), 1u);
  EXPECT_TRUE(router.take_commands().handovers.empty());
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

}  // namespace
}  // namespace troupe
