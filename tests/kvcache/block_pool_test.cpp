#include "kvcache/block_pool.hpp"

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

TEST(block_pool, takes_least_recently_freed_first) {
  block_pool pool(4, 2, true);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  auto all = pool.take(4);
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  pool.release(2);
  pool.release(0);
  pool.release(3);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  // Freed order 2, 0, 3: the oldest free block is handed out first.
  EXPECT_EQ(pool.take(1), std::vector<int32_t>{2});
  EXPECT_EQ(pool.take(2), (std::vector<int32_t>{0, 3}));
}

TEST(block_pool, refuses_to_take_more_than_free_and_changes_nothing) {
  block_pool pool(3, 4, false);
  pool.take(2);
  EXPECT_THROW(pool.take(2), std::runtime_error);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.take(1), std::vector<int32_t>{2});
}

TEST(block_pool, ref_counts_keep_shared_blocks_out_of_the_free_list) {
  block_pool pool(2, 4, true);
  auto ids = pool.take(1);
  pool.acquire(ids[0]);
  EXPECT_EQ(pool.ref_count(ids[0]), 2);
  pool.release(ids[0]);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.release(ids[0]);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_THROW(pool.release(ids[0]), std::runtime_error);
}

TEST(block_pool, cached_block_survives_free_until_evicted) {
  block_pool pool(2, 4, true);
  auto t = tokens(10, 4);
  block_hash h = block_pool::hash_block(block_pool::root_hash, t);
  int32_t id = pool.take(1)[0];
  pool.cache_full_block(id, block_pool::root_hash, h, t);
  pool.release(id);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, h, t), id);
  // Reviving a free cached block takes it out of the free list.
  pool.acquire(id);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.release(id);
  // Both blocks taken: the cached one is evicted on reuse.
  pool.take(2);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, h, t), -1);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
}

// After a failed step (a pipeline stage that restarted lost its layers' KV) no cached block may
// be hit again; the blocks themselves stay where they are, referenced or free.
TEST(block_pool, forgetting_the_cache_leaves_no_hit_and_every_block_in_place) {
  block_pool pool(3, 4, true);
  const auto a = tokens(10, 4), b = tokens(20, 4);
  const block_hash ha = block_pool::hash_block(block_pool::root_hash, a);
  const block_hash hb = block_pool::hash_block(ha, b);
  const auto ids = pool.take(2);
  pool.cache_full_block(ids[0], block_pool::root_hash, ha, a);
  pool.cache_full_block(ids[1], ha, hb, b);
  pool.release(ids[1]);  // one free, one still referenced
  EXPECT_EQ(pool.forget_cached(), 2);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, ha, a), -1);
  EXPECT_EQ(pool.find_cached(ha, hb, b), -1);
  EXPECT_EQ(pool.ref_count(ids[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_EQ(pool.forget_cached(), 0);
  // A block cached again afterwards is found as before.
  pool.cache_full_block(ids[0], block_pool::root_hash, ha, a);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, ha, a), ids[0]);
}

TEST(block_pool, hit_is_confirmed_by_tokens_and_parent) {
  block_pool pool(2, 4, true);
  auto t = tokens(0, 4);
  block_hash h = block_pool::hash_block(block_pool::root_hash, t);
  int32_t id = pool.take(1)[0];
  pool.cache_full_block(id, block_pool::root_hash, h, t);
  auto other = tokens(1, 4);
  // Same hash key, different tokens (as a collision would look): no hit.
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, h, other), -1);
  EXPECT_EQ(pool.find_cached(h, h, t), -1);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, h, t), id);
}

TEST(block_pool, hash_depends_on_parent_and_every_token) {
  auto t = tokens(5, 16);
  block_hash a = block_pool::hash_block(block_pool::root_hash, t);
  EXPECT_EQ(a, block_pool::hash_block(block_pool::root_hash, t));
  EXPECT_NE(a, block_pool::hash_block(a, t));
  for (size_t i = 0; i < t.size(); ++i) {
    auto u = t;
    u[i] += 1;
    EXPECT_NE(a, block_pool::hash_block(block_pool::root_hash, u)) << "token " << i;
  }
}

TEST(block_pool, prefix_caching_off_never_hits) {
  block_pool pool(2, 2, false);
  auto t = tokens(0, 2);
  block_hash h = block_pool::hash_block(block_pool::root_hash, t);
  int32_t id = pool.take(1)[0];
  pool.cache_full_block(id, block_pool::root_hash, h, t);
  EXPECT_EQ(pool.find_cached(block_pool::root_hash, h, t), -1);
}

}  // namespace
}  // namespace troupe
