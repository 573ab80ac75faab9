#include "kvcache/kv_cache_manager.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

namespace troupe {
namespace {

std::vector<int32_t> tokens(int first, int count) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(kv_cache_manager, allocate_and_append_count_blocks) {
  kv_cache_manager kv(10, 4, false);
  block_table table;
  prefix_hit none;
  ASSERT_TRUE(kv.can_allocate(none, 9));
  kv.allocate(table, none, 9);
  EXPECT_EQ(table.num_blocks(), 3);
  EXPECT_EQ(kv.num_free_blocks(), 7);
  // Growing within the last block costs nothing; crossing a boundary takes one block.
  kv.append(table, 12);
  EXPECT_EQ(table.num_blocks(), 3);
  kv.append(table, 13);
  EXPECT_EQ(table.num_blocks(), 4);
  kv.free(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(kv.num_free_blocks(), 10);
}

// A sliding window's blocks behind it go back to the pool, keep their places in the table and
// (registered first) their prefix-cache entries; the rest of the table works on around them.
TEST(kv_cache_manager, blocks_behind_a_window_are_released_in_place) {
  kv_cache_manager kv(10, 4, true);
  block_table table;
  const std::vector<int32_t> ids = tokens(100, 24);
  kv.allocate(table, prefix_hit{}, 20);      // 5 blocks
  kv.cache_computed_blocks(table, ids, 16);  // blocks 0-3 registered
  const std::vector<int32_t> before = table.block_ids;
  // Tokens before 9 are no query's: blocks 0 and 1 (tokens 0-7) go, block 2 (8-11) stays; only
  // the first 4 blocks may go (the ones the worker knows), which is no limit here.
  EXPECT_EQ(kv.release_before(table, 9, 4), 2);
  EXPECT_EQ(table.num_blocks(), 5);
  EXPECT_EQ(table.num_held_blocks(), 3);
  EXPECT_EQ(table.block_ids[0], block_table::released);
  EXPECT_EQ(table.block_ids[1], block_table::released);
  EXPECT_EQ(table.block_ids[2], before[2]);
  EXPECT_EQ(kv.num_free_blocks(), 7);
  EXPECT_EQ(kv.release_before(table, 9, 4), 0);    // already given back
  EXPECT_EQ(kv.release_before(table, 100, 3), 1);  // the limit: block 2 only
  // The released blocks are still a prefix another request may find.
  EXPECT_EQ(kv.find_cached_prefix(ids).num_tokens, 16);
  // Registering more of the table hashes through the released places.
  kv.append(table, 24);
  kv.cache_computed_blocks(table, ids, 24);
  EXPECT_EQ(table.hashes.size(), 6u);
  EXPECT_EQ(kv.find_cached_prefix(ids).num_tokens, 20);  // never the last token
  kv.free(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(kv.num_free_blocks(), 10);
}

TEST(kv_cache_manager, failed_changes_leave_no_trace) {
  kv_cache_manager kv(3, 4, false);
  block_table table;
  prefix_hit none;
  EXPECT_FALSE(kv.can_allocate(none, 13));
  EXPECT_THROW(kv.allocate(table, none, 13), std::runtime_error);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(kv.num_free_blocks(), 3);
  kv.allocate(table, none, 8);
  EXPECT_FALSE(kv.can_append(table, 13));
  EXPECT_THROW(kv.append(table, 13), std::runtime_error);
  EXPECT_EQ(table.num_blocks(), 2);
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_TRUE(kv.can_append(table, 12));
  EXPECT_THROW(kv.allocate(table, none, 4), std::runtime_error);  // table not empty
  kv.free(table);
  EXPECT_EQ(kv.num_free_blocks(), 3);
}

TEST(kv_cache_manager, prefix_hit_shares_blocks_and_counts_references) {
  kv_cache_manager kv(8, 4, true);
  auto prompt = tokens(100, 10);  // two full blocks + 2 tokens
  block_table a;
  kv.allocate(a, kv.find_cached_prefix(prompt), 10);
  EXPECT_EQ(kv.find_cached_prefix(prompt).num_tokens, 0);  // nothing computed yet
  kv.cache_computed_blocks(a, prompt, 10);
  EXPECT_EQ(a.hashes.size(), 2u);

  // Same first 8 tokens, different tail.
  auto other = prompt;
  other[9] = 7;
  prefix_hit hit = kv.find_cached_prefix(other);
  ASSERT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.block_ids, (std::vector<int32_t>{a.block_ids[0], a.block_ids[1]}));
  block_table b;
  int free_before = kv.num_free_blocks();
  kv.allocate(b, hit, 10);
  EXPECT_EQ(kv.num_free_blocks(), free_before - 1);  // only the tail block is new
  EXPECT_EQ(kv.pool().ref_count(a.block_ids[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(a.block_ids[1]), 2);

  // A prompt differing in the first block shares nothing, even though its second block matches.
  auto diverged = prompt;
  diverged[0] = 1;
  EXPECT_EQ(kv.find_cached_prefix(diverged).num_tokens, 0);

  kv.free(a);
  EXPECT_EQ(kv.pool().ref_count(b.block_ids[0]), 1);
  kv.free(b);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  // Freed cached blocks are still found, and reviving them takes them from the free count.
  hit = kv.find_cached_prefix(prompt);
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_TRUE(kv.can_allocate(hit, 10));
  block_table c;
  kv.allocate(c, hit, 10);
  EXPECT_EQ(kv.num_free_blocks(), 5);
  kv.free(c);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST(kv_cache_manager, hit_never_covers_the_last_token) {
  kv_cache_manager kv(8, 4, true);
  auto prompt = tokens(0, 8);  // exactly two blocks
  block_table a;
  kv.allocate(a, {}, 8);
  kv.cache_computed_blocks(a, prompt, 8);
  prefix_hit hit = kv.find_cached_prefix(prompt);
  EXPECT_EQ(hit.num_tokens, 4);  // the second block holds the last token: recomputed
  kv.free(a);
}

TEST(kv_cache_manager, free_hit_blocks_count_against_admission) {
  kv_cache_manager kv(3, 4, true);
  auto prompt = tokens(0, 9);
  block_table a;
  kv.allocate(a, {}, 9);
  kv.cache_computed_blocks(a, prompt, 9);
  kv.free(a);
  prefix_hit hit = kv.find_cached_prefix(prompt);
  ASSERT_EQ(hit.num_tokens, 8);
  // 2 hit blocks (free, so they count as 2 of the 3 free) + 2 new blocks = 4 > 3.
  EXPECT_FALSE(kv.can_allocate(hit, 13));
  EXPECT_TRUE(kv.can_allocate(hit, 12));
  block_table b;
  EXPECT_THROW(kv.allocate(b, hit, 13), std::runtime_error);
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_EQ(kv.pool().ref_count(hit.block_ids[0]), 0);
}

TEST(kv_cache_manager, only_computed_full_blocks_are_cached) {
  kv_cache_manager kv(8, 4, true);
  auto prompt = tokens(0, 12);
  block_table a;
  kv.allocate(a, {}, 12);
  kv.cache_computed_blocks(a, prompt, 7);  // a chunk of 7 computed: one full block
  EXPECT_EQ(a.hashes.size(), 1u);
  EXPECT_EQ(kv.find_cached_prefix(prompt).num_tokens, 4);
  kv.cache_computed_blocks(a, prompt, 12);
  EXPECT_EQ(a.hashes.size(), 3u);
  EXPECT_EQ(kv.find_cached_prefix(prompt).num_tokens, 8);
  kv.free(a);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST(kv_cache_manager, eviction_takes_a_freed_sequence_tail_first) {
  kv_cache_manager kv(4, 2, true);
  auto prompt = tokens(0, 7);
  block_table a;
  kv.allocate(a, {}, 7);  // blocks 0..3
  kv.cache_computed_blocks(a, prompt, 7);
  kv.free(a);
  // One block taken: the freed tail goes first, the shareable head stays cached.
  block_table b;
  kv.allocate(b, {}, 2);
  EXPECT_EQ(kv.find_cached_prefix(prompt).num_tokens, 6);
  kv.allocate(a, {}, 2);
  EXPECT_EQ(kv.find_cached_prefix(prompt).num_tokens, 4);
  kv.free(a);
  kv.free(b);
}

}  // namespace
}  // namespace troupe
