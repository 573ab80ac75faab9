// The payload buffers' pool on its own: a buffer given back is taken again (the smallest that
// fits), and what is kept stays within its count and byte bounds, gives way to bigger buffers,
// is trimmed on demand and freed after an idle spell.

#include "kvtransfer/kv_buffer_pool.hpp"

#include <gtest/gtest.h>

namespace troupe::test {
namespace {

using namespace std::chrono_literals;

TEST(kv_buffer_pool, a_buffer_given_back_is_taken_again_instead_of_a_new_one) {
  kv_buffer_pool pool(4, 1 << 20);
  std::vector<std::byte> first = pool.take(1000);
  EXPECT_EQ(first.size(), 1000u);
  const std::byte* memory = first.data();
  pool.give_back(std::move(first));
  EXPECT_EQ(pool.stats().num_kept, 1u);
  std::vector<std::byte> again = pool.take(600);  // smaller fits: the same memory, resized
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(again.size(), 600u);
  std::vector<std::byte> bigger = pool.take(5000);  // nothing kept fits: allocated
  EXPECT_EQ(bigger.size(), 5000u);
  const kv_buffer_pool_stats stats = pool.stats();
  EXPECT_EQ(stats.num_reused, 1u);
  EXPECT_EQ(stats.num_allocated, 2u);
  EXPECT_EQ(stats.num_kept, 0u);
  EXPECT_EQ(stats.num_kept_bytes, 0u);
  EXPECT_TRUE(pool.take(0).empty());  // an in-place frame's empty payload is no buffer
  EXPECT_EQ(pool.stats().num_allocated, 2u);
}

TEST(kv_buffer_pool, take_picks_the_smallest_kept_buffer_that_fits) {
  kv_buffer_pool pool(8, 1 << 20);
  std::vector<std::byte> small(1024), middle(4096), large(16384);
  const std::byte* middle_memory = middle.data();
  pool.give_back(std::move(large));
  pool.give_back(std::move(small));
  pool.give_back(std::move(middle));
  std::vector<std::byte> taken = pool.take(3000);
  EXPECT_EQ(taken.data(), middle_memory);
  EXPECT_EQ(pool.stats().num_kept, 2u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 1024u + 16384u);
}

TEST(kv_buffer_pool, what_is_kept_stays_within_its_count_and_bytes) {
  kv_buffer_pool by_count(3, 1 << 20);
  for (int i = 0; i < 40; ++i) by_count.give_back(std::vector<std::byte>(100));
  EXPECT_EQ(by_count.stats().num_kept, 3u);
  EXPECT_EQ(by_count.stats().num_kept_bytes, 300u);

  kv_buffer_pool by_bytes(16, 10000);
  for (int i = 0; i < 10; ++i) by_bytes.give_back(std::vector<std::byte>(4000));
  EXPECT_EQ(by_bytes.stats().num_kept, 2u);
  EXPECT_LE(by_bytes.stats().num_kept_bytes, 10000u);
  by_bytes.give_back(std::vector<std::byte>(20000));  // above the bound on its own: freed
  EXPECT_EQ(by_bytes.stats().num_kept, 2u);
  EXPECT_LE(by_bytes.stats().num_kept_bytes, 10000u);
}

TEST(kv_buffer_pool, a_bigger_buffer_replaces_smaller_ones_when_full) {
  kv_buffer_pool pool(2, 10000);
  pool.give_back(std::vector<std::byte>(1000));
  pool.give_back(std::vector<std::byte>(2000));
  std::vector<std::byte> grown(6000);  // the frames grew: the small ones make way
  const std::byte* memory = grown.data();
  pool.give_back(std::move(grown));
  EXPECT_EQ(pool.stats().num_kept, 2u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 8000u);
  EXPECT_EQ(pool.take(5000).data(), memory);
  pool.give_back(std::vector<std::byte>(500));  // a smaller one does not push a bigger one out
  pool.give_back(std::vector<std::byte>(400));
  EXPECT_EQ(pool.stats().num_kept, 2u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 2500u);
}

TEST(kv_buffer_pool, trim_frees_the_largest_first) {
  kv_buffer_pool pool(8, 1 << 20);
  for (size_t bytes : {1000, 8000, 3000, 5000}) pool.give_back(std::vector<std::byte>(bytes));
  pool.trim_to(9000);  // 17000 kept: 8000 goes, then 9000 fits
  EXPECT_EQ(pool.stats().num_kept, 3u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 9000u);
  pool.trim_to(0);
  EXPECT_EQ(pool.stats().num_kept, 0u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 0u);
}

TEST(kv_buffer_pool, an_idle_pool_frees_what_it_kept) {
  kv_buffer_pool pool(8, 1 << 20);
  std::vector<std::byte> buffer = pool.take(4096);
  const auto taken_at = std::chrono::steady_clock::now();
  pool.give_back(std::move(buffer));
  pool.release_if_idle(taken_at, 10s);  // taken just now: kept
  EXPECT_EQ(pool.stats().num_kept, 1u);
  pool.release_if_idle(taken_at + 11s, 10s);
  EXPECT_EQ(pool.stats().num_kept, 0u);
  EXPECT_EQ(pool.stats().num_kept_bytes, 0u);
}

}  // namespace
}  // namespace troupe::test
