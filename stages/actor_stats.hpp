#pragma once
// What one actor does, as its behaviour's wrapper sees it (stages/instrumented_actor.hpp): the
// messages it handled, how long each handler ran, and how many messages waited in its mailbox
// when it took the next one. Plain data and arithmetic, no CAF, so it is tested without actors.
//
// The actor records from its own thread; an inspector reads a snapshot from another, so both go
// through one mutex (uncontended on the actor's side but for the inspector's read once a second).
// Rates, busy share and percentiles are over the last second, in ten slots of 100 ms that are
// reused as time moves on; counts and the largest depth are since the actor started.

#include <array>
#include <cstdint>
#include <mutex>

#include "stages/stage_clock.hpp"

namespace troupe {

struct actor_stats_snapshot {
  int64_t num_messages = 0;       // handled since the actor started
  int64_t mailbox_depth = 0;      // messages waiting when it last took one
  int64_t max_mailbox_depth = 0;  // the most it ever saw waiting
  double messages_per_s = 0;      // handled in the last second
  double busy_share = 0;          // of the last second spent in handlers, 0 to 1
  double handler_p50_us = 0;      // handler time of the last second's messages (0: none)
  double handler_p99_us = 0;
  double mean_mailbox_depth = 0;  // seen by the last second's messages
  // How long a message waited in the mailbox, on average over the last second: CAF 0.17's
  // mailbox elements carry no arrival time, so it is estimated by Little's law (mean depth over
  // arrival rate) rather than measured per message.
  double estimated_wait_ms = 0;
  double since_last_s = -1;  // since its last handler ended (it may be in one now); -1: none yet
};

// Handler times in log-spaced bins: four per power of two of nanoseconds, so a percentile is
// off by at most 1/8 of its value. Integer arithmetic only: it sits on every message's path.
class handler_time_histogram {
 public:
  static constexpr int num_bins = 4 * 44;  // up to 2^44 ns (about 4.9 hours)

  void add(duration_ns ns) { ++counts_[bin_of(ns)]; }
  void add(const handler_time_histogram& other);
  void clear() { counts_.fill(0); }
  int64_t count() const;
  // The q-quantile (0 < q <= 1) in microseconds, the middle of its bin; 0 when empty.
  double quantile_us(double q) const;

  static int bin_of(duration_ns ns);
  static double bin_middle_ns(int bin);

 private:
  std::array<uint32_t, num_bins> counts_{};
};

class actor_stats {
 public:
  static constexpr duration_ns slot_ns = 100'000'000;  // 100 ms
  static constexpr int num_slots = 10;                 // the last second

  // One handled message: when its handler began, how long it ran, and how many messages were
  // waiting behind it when it was taken.
  void record(timestamp_ns begin, duration_ns handler, int64_t mailbox_depth);
  actor_stats_snapshot snapshot(timestamp_ns now) const;

 private:
  struct slot {
    int64_t epoch = -1;  // begin / slot_ns of the messages it counts; -1: never used
    int64_t num_messages = 0;
    duration_ns busy_ns = 0;
    int64_t depth_sum = 0;
    handler_time_histogram handler_times;
  };

  mutable std::mutex mutex_;
  std::array<slot, num_slots> slots_;  // guarded by mutex_
  int64_t num_messages_ = 0;           // guarded by mutex_
  int64_t last_depth_ = 0;             // guarded by mutex_
  int64_t max_depth_ = 0;              // guarded by mutex_
  timestamp_ns last_end_ = -1;         // guarded by mutex_
};

}  // namespace troupe
