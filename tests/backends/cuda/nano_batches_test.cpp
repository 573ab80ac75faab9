// plan_nano_batches (backends/cuda/nano_batches.hpp): the cut of a step's batch into pieces that a
// device runs side by side. Checked for every batch shape drawn: the pieces cover every sequence
// and row once, in order, cut only between sequences, respect the minimum size, and balance rows
// as well as whole sequences allow.

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backends/cuda/nano_batches.hpp"

namespace troupe {
namespace {

std::vector<int32_t> starts_of(const std::vector<int>& lengths) {
  std::vector<int32_t> q{0};
  for (int n : lengths) q.push_back(q.back() + n);
  return q;
}

void expect_a_partition(const std::vector<nano_batch>& pieces, const std::vector<int32_t>& q) {
  ASSERT_FALSE(pieces.empty());
  EXPECT_EQ(pieces.front().first_seq, 0);
  EXPECT_EQ(pieces.back().end_seq, static_cast<int>(q.size()) - 1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const nano_batch& p = pieces[i];
    EXPECT_LT(p.first_seq, p.end_seq) << "piece " << i << " holds no sequence";
    EXPECT_EQ(p.first_row, q[p.first_seq]);
    EXPECT_EQ(p.end_row, q[p.end_seq]);
    if (i > 0) {
      EXPECT_EQ(p.first_seq, pieces[i - 1].end_seq);
    }
  }
}

TEST(nano_batches, a_batch_too_small_to_cut_stays_whole) {
  const auto q = starts_of({3, 5, 1, 1});
  const auto pieces = plan_nano_batches(q, 2, 256);
  ASSERT_EQ(pieces.size(), 1u);
  expect_a_partition(pieces, q);
  EXPECT_EQ(pieces[0].num_rows(), 10);
}

TEST(nano_batches, one_piece_asked_or_one_sequence_gives_one_piece) {
  EXPECT_EQ(plan_nano_batches(starts_of({600, 600}), 1, 1).size(), 1u);
  EXPECT_EQ(plan_nano_batches(starts_of({4096}), 4, 1).size(), 1u);
  EXPECT_TRUE(plan_nano_batches({0}, 2, 1).empty());
}

TEST(nano_batches, two_pieces_split_the_rows_evenly_at_a_sequence_boundary) {
  // 64 decodes and two prompt chunks: 64 + 300 + 200 = 564 rows, half is 282.
  std::vector<int> lengths(64, 1);
  lengths.push_back(300);
  lengths.push_back(200);
  const auto q = starts_of(lengths);
  const auto pieces = plan_nano_batches(q, 2, 128);
  ASSERT_EQ(pieces.size(), 2u);
  expect_a_partition(pieces, q);
  // The nearest boundaries to 282 are 64 (after the decodes) and 364: 364 is 82 away, 64 is 218.
  EXPECT_EQ(pieces[0].end_row, 364);
  EXPECT_EQ(pieces[1].num_rows(), 200);
}

TEST(nano_batches, a_piece_below_the_minimum_joins_its_neighbour) {
  // One 1000-token chunk and a few decodes: cutting after the chunk would leave 4 rows.
  const auto q = starts_of({1000, 1, 1, 1, 1});
  const auto pieces = plan_nano_batches(q, 2, 64);
  ASSERT_EQ(pieces.size(), 1u);
  expect_a_partition(pieces, q);
}

TEST(nano_batches, random_batches_are_partitioned_and_balanced) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int> lengths(std::uniform_int_distribution<int>(1, 40)(rng));
    for (int& n : lengths) n = rng() % 4 == 0 ? std::uniform_int_distribution<int>(2, 400)(rng) : 1;
    const auto q = starts_of(lengths);
    const int max_pieces = std::uniform_int_distribution<int>(1, 4)(rng);
    const int min_rows = std::uniform_int_distribution<int>(1, 200)(rng);
    const auto pieces = plan_nano_batches(q, max_pieces, min_rows);
    expect_a_partition(pieces, q);
    ASSERT_LE(static_cast<int>(pieces.size()), max_pieces);
    if (pieces.size() > 1) {
      for (const auto& p : pieces) EXPECT_GE(p.num_rows(), min_rows) << "trial " << trial;
    }
    // Two pieces asked: whenever some boundary leaves min_rows on both sides, the batch is cut.
    bool cuttable = false;
    for (size_t k = 1; k + 1 < q.size(); ++k) cuttable |= q[k] >= min_rows && q.back() - q[k] >= min_rows;
    if (max_pieces == 2) {
      EXPECT_EQ(pieces.size(), cuttable ? 2u : 1u) << "trial " << trial;
    }
    // Balance: no piece exceeds an even share by more than the longest sequence it could not cut.
    const int longest = *std::max_element(lengths.begin(), lengths.end());
    const int share = (q.back() + static_cast<int>(pieces.size()) - 1) / static_cast<int>(pieces.size());
    if (pieces.size() > 1) {
      for (const auto& p : pieces) EXPECT_LE(p.num_rows(), share + longest) << "trial " << trial;
    }
  }
}

TEST(nano_batches, bad_input_is_refused) {
  EXPECT_THROW(plan_nano_batches({}, 2, 1), std::runtime_error);
  EXPECT_THROW(plan_nano_batches({1, 2}, 2, 1), std::runtime_error);
  EXPECT_THROW(plan_nano_batches({0, 2}, 0, 1), std::runtime_error);
}

}  // namespace
}  // namespace troupe
