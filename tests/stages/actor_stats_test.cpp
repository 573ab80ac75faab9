// actor_stats: counts, the last second's rate, busy share and handler percentiles, mailbox
// depths, the Little's-law wait, and the window moving on; the histogram's bins.

#include <gtest/gtest.h>

#include <cmath>

#include "stages/actor_stats.hpp"

namespace troupe {
namespace {

constexpr timestamp_ns ms = 1'000'000;
constexpr timestamp_ns s = 1'000'000'000;
// A start far from zero, as a steady clock's readings are, and on a slot boundary.
constexpr timestamp_ns t0 = 1000 * s;

TEST(handler_time_histogram, bins_are_ordered_and_hold_their_values) {
  int last = -1;
  for (duration_ns ns : {0L, 1L, 3L, 4L, 5L, 7L, 8L, 100L, 1000L, 123456L, 10'000'000L, 5'000'000'000L}) {
    const int bin = handler_time_histogram::bin_of(ns);
    EXPECT_GE(bin, last) << ns;
    last = bin;
    // The bin's middle is within an eighth of any value in it (the bins are a quarter octave).
    if (ns >= 4) {
      EXPECT_NEAR(handler_time_histogram::bin_middle_ns(bin), ns, ns / 8.0 + 1) << ns;
    }
  }
  EXPECT_EQ(handler_time_histogram::bin_of(-5), 0);
  EXPECT_EQ(handler_time_histogram::bin_of(INT64_MAX), handler_time_histogram::num_bins - 1);
}

TEST(handler_time_histogram, quantiles_of_known_values) {
  handler_time_histogram h;
  EXPECT_EQ(h.quantile_us(0.5), 0);
  for (int i = 0; i < 98; ++i) h.add(10'000);  // 10 us
  for (int i = 0; i < 2; ++i) h.add(5 * ms);   // 5 ms
  EXPECT_EQ(h.count(), 100);
  EXPECT_NEAR(h.quantile_us(0.5), 10, 10 / 8.0);
  EXPECT_NEAR(h.quantile_us(0.98), 10, 10 / 8.0);
  EXPECT_NEAR(h.quantile_us(0.99), 5000, 5000 / 8.0);  // the 99th of 100 is a slow one
  EXPECT_NEAR(h.quantile_us(1.0), 5000, 5000 / 8.0);
}

TEST(actor_stats, counts_rate_busy_share_and_percentiles_over_the_last_second) {
  actor_stats stats;
  // Ten messages of 1 ms each within one second, the queue behind them shrinking 9, 8, ... 0.
  for (int i = 0; i < 10; ++i) stats.record(t0 + i * 90 * ms, 1 * ms, 9 - i);
  const actor_stats_snapshot snap = stats.snapshot(t0 + 950 * ms);
  EXPECT_EQ(snap.num_messages, 10);
  EXPECT_DOUBLE_EQ(snap.messages_per_s, 10);
  EXPECT_NEAR(snap.busy_share, 0.010, 1e-9);
  EXPECT_NEAR(snap.handler_p50_us, 1000, 1000 / 8.0);
  EXPECT_NEAR(snap.handler_p99_us, 1000, 1000 / 8.0);
  EXPECT_EQ(snap.mailbox_depth, 0);  // the last one left nothing behind
  EXPECT_EQ(snap.max_mailbox_depth, 9);
  EXPECT_DOUBLE_EQ(snap.mean_mailbox_depth, 4.5);
  // Little's law: 4.5 messages waiting on average, 10 arriving per second: 450 ms each.
  EXPECT_NEAR(snap.estimated_wait_ms, 450, 1e-9);
  EXPECT_NEAR(snap.since_last_s, 0.950 - 0.811, 1e-9);
}

TEST(actor_stats, the_window_moves_on_and_the_totals_stay) {
  actor_stats stats;
  for (int i = 0; i < 5; ++i) stats.record(t0 + i * ms, 2 * ms, 3);
  // 1.5 s later: the burst is out of the window; only the totals remember it.
  actor_stats_snapshot snap = stats.snapshot(t0 + 1500 * ms);
  EXPECT_EQ(snap.num_messages, 5);
  EXPECT_EQ(snap.messages_per_s, 0);
  EXPECT_EQ(snap.busy_share, 0);
  EXPECT_EQ(snap.handler_p50_us, 0);
  EXPECT_EQ(snap.estimated_wait_ms, 0);
  EXPECT_EQ(snap.max_mailbox_depth, 3);
  // A message 10 slots later reuses the burst's slot: the burst's entries must be gone from it.
  stats.record(t0 + 1000 * ms, 100'000, 0);
  snap = stats.snapshot(t0 + 1050 * ms);
  EXPECT_EQ(snap.num_messages, 6);
  EXPECT_EQ(snap.messages_per_s, 1);
  EXPECT_NEAR(snap.handler_p50_us, 100, 100 / 8.0);
  EXPECT_EQ(snap.mean_mailbox_depth, 0);
}

TEST(actor_stats, a_handler_longer_than_the_window_is_at_most_all_of_it) {
  actor_stats stats;
  stats.record(t0, 3 * s, 0);  // one long step
  const actor_stats_snapshot snap = stats.snapshot(t0 + 3 * s - 1);
  EXPECT_LE(snap.busy_share, 1.0);
  EXPECT_EQ(actor_stats().snapshot(t0).since_last_s, -1);  // nothing handled yet
}

TEST(actor_stats, busy_share_adds_the_slots_of_the_last_second) {
  actor_stats stats;
  // A worker-like actor: a 60 ms step every 100 ms for a second: busy 60 %.
  for (int i = 0; i < 10; ++i) stats.record(t0 + i * 100 * ms, 60 * ms, 1);
  const actor_stats_snapshot snap = stats.snapshot(t0 + 999 * ms);
  EXPECT_NEAR(snap.busy_share, 0.6, 1e-9);
  EXPECT_NEAR(snap.handler_p50_us, 60'000, 60'000 / 8.0);
  EXPECT_EQ(snap.mailbox_depth, 1);
}

}  // namespace
}  // namespace troupe
