// The pipeline stages' busy shares (issue 27, `troupe scale --list`): each stage's compute time
// over the last 10 s, in layer order, judged over the time since it was first seen while that is
// shorter (but never less than a second), clamped to what a stage can be, and forgotten with its
// model.

#include <gtest/gtest.h>

#include "pipeline/stage_load.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using clock_type = stage_load_board::clock;

TEST(stage_load, shares_are_of_the_last_window_in_layer_order) {
  stage_load_board board;
  const clock_type::time_point t0{};
  board.add({2, 5}, "here", 0ns, t0);
  board.add({0, 2}, "kvtcp://127.0.0.1:9", 0ns, t0);
  board.add({0, 2}, "kvtcp://127.0.0.1:9", 4s, t0 + 8s);
  board.add({2, 5}, "here", 2s, t0 + 10s);
  std::vector<stage_busy> shares = board.shares(t0 + 10s);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_EQ(shares[0].layers.first, 0);
  EXPECT_EQ(shares[0].where, "kvtcp://127.0.0.1:9");
  EXPECT_DOUBLE_EQ(shares[0].busy_share, 0.4);
  EXPECT_EQ(shares[1].where, "here");
  EXPECT_DOUBLE_EQ(shares[1].busy_share, 0.2);
  EXPECT_EQ(stage_busy_text(shares), "0-1:40.0%,2-4:20.0%");

  // 19 s on, the first stage's work has left the window; the second's is still in it.
  shares = board.shares(t0 + 19s);
  EXPECT_DOUBLE_EQ(shares[0].busy_share, 0.0);
  EXPECT_DOUBLE_EQ(shares[1].busy_share, 0.2);
}

TEST(stage_load, a_new_stage_is_judged_over_its_time_seen_and_a_lying_one_is_clamped) {
  stage_load_board board;
  const clock_type::time_point t0{};
  board.add({0, 1}, "a", 1s, t0);
  board.add({0, 1}, "a", 1s, t0 + 4s);
  EXPECT_DOUBLE_EQ(board.shares(t0 + 4s)[0].busy_share, 0.5) << "2 s of 4";
  board.add({1, 2}, "b", 1ms, t0 + 4s);
  EXPECT_DOUBLE_EQ(board.shares(t0 + 4s)[1].busy_share, 0.001) << "a first step is judged over a second";
  // A remote stage says what it computed: one that claims more than the window is clamped.
  board.add({1, 2}, "b", 100s, t0 + 5s);
  EXPECT_DOUBLE_EQ(board.shares(t0 + 5s)[1].busy_share, 1.0);
}

TEST(stage_load, a_forgotten_stage_is_not_listed) {
  stage_load_board board;
  board.add({0, 1}, "a", 1s, clock_type::time_point{});
  board.add({1, 2}, "here", 1s, clock_type::time_point{});
  board.forget({0, 1}, "a");
  const std::vector<stage_busy> shares = board.shares(clock_type::time_point{} + 1s);
  ASSERT_EQ(shares.size(), 1u);
  EXPECT_EQ(shares[0].where, "here");
  EXPECT_EQ(stage_busy_text({}), "");
}

}  // namespace
}  // namespace troupe
