// A waiting request that cannot be admitted yet is looked up in the prefix cache every step; its
// prompt's block hashes are computed once and kept in the sequence, not recomputed each time.

#include <gtest/gtest.h>

#include "engine/scheduler.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::make_prompt;

TEST(waiting_head, is_hashed_once_while_it_waits_for_blocks) {
  // 6 blocks of 4 tokens. Request 1 holds three blocks for a while; request 2 shares its first
  // two (cached once request 1's prompt is computed) but needs four more, so it waits.
  auto sched = create_scheduler(6, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(8), greedy(12)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(21), greedy(3)));
  step_plan plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u) << "request 2 must wait";
  sched->update(plan, fake_run(plan));  // request 1's prompt blocks enter the cache
  plan = sched->schedule();
  ASSERT_EQ(sched->find(2)->status(), sequence_status::waiting);
  // Two hits, then the first miss: the lookup stops there, with three hashes kept.
  EXPECT_EQ(sched->find(2)->block_hashes().size(), 3u);
  const uint64_t hashed = sched->kv_cache().num_blocks_hashed();
  int num_waiting_steps = 0;
  for (int step = 0; step < 40 && sched->has_unfinished(); ++step) {
    sched->update(plan, fake_run(plan));
    plan = sched->schedule();
    const sequence* waiting = sched->find(2);
    if (waiting == nullptr || waiting->status() != sequence_status::waiting) break;
    ++num_waiting_steps;
    EXPECT_EQ(sched->kv_cache().num_blocks_hashed(), hashed) << "step " << step << " rehashed the waiting head";
  }
  EXPECT_GE(num_waiting_steps, 3);
}

TEST(waiting_head, memoized_lookup_finds_what_a_fresh_lookup_finds) {
  kv_cache_manager kv(16, 4, /*enable_prefix_caching=*/true);
  std::vector<int32_t> tokens = make_prompt(13);
  block_table table;
  kv.allocate(table, kv.find_cached_prefix(tokens), 13);
  kv.cache_computed_blocks(table, tokens, 13);
  std::vector<block_hash> memo;
  const prefix_hit fresh = kv.find_cached_prefix(tokens);
  const prefix_hit first = kv.find_cached_prefix(tokens, memo);
  const prefix_hit again = kv.find_cached_prefix(tokens, memo);
  EXPECT_EQ(fresh.block_ids, first.block_ids);
  EXPECT_EQ(fresh.hashes, first.hashes);
  EXPECT_EQ(again.block_ids, first.block_ids);
  EXPECT_EQ(first.num_tokens, 12);
  // Tokens appended later extend the memo; the blocks already hashed are not hashed again.
  const uint64_t before = kv.num_blocks_hashed();
  for (int32_t t : make_prompt(8, 90)) tokens.push_back(t);
  kv.find_cached_prefix(tokens, memo);
  // Three hits from the memo, then one new block hashed and missed: the lookup stops there.
  EXPECT_EQ(memo.size(), 4u);
  EXPECT_EQ(kv.num_blocks_hashed() - before, 1u);
}

}  // namespace
}  // namespace troupe
