#include "stages/actor_stats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace troupe {

int handler_time_histogram::bin_of(duration_ns ns) {
  if (ns < 4) return ns < 0 ? 0 : static_cast<int>(ns);
  const auto value = static_cast<uint64_t>(ns);
  const int msb = std::min(63 - std::countl_zero(value), num_bins / 4);  // 2 or more
  if (msb == num_bins / 4) return num_bins - 1;
  const int sub = static_cast<int>((value >> (msb - 2)) & 3u);
  return 4 * (msb - 1) + sub;
}

double handler_time_histogram::bin_middle_ns(int bin) {
  if (bin < 4) return bin;
  const int msb = bin / 4 + 1;
  const int sub = bin % 4;
  const double width = std::ldexp(1.0, msb - 2);
  return (4 + sub) * width + width / 2;
}

void handler_time_histogram::add(const handler_time_histogram& other) {
  for (int i = 0; i < num_bins; ++i) counts_[i] += other.counts_[i];
}

int64_t handler_time_histogram::count() const {
  int64_t n = 0;
  for (uint32_t c : counts_) n += c;
  return n;
}

double handler_time_histogram::quantile_us(double q) const {
  const int64_t n = count();
  if (n == 0) return 0;
  // The smallest value with at least q·n values at or below it.
  const auto rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * static_cast<double>(n))));
  int64_t seen = 0;
  for (int i = 0; i < num_bins; ++i) {
    seen += counts_[i];
    if (seen >= rank) return bin_middle_ns(i) / 1000.0;
  }
  return bin_middle_ns(num_bins - 1) / 1000.0;
}

void actor_stats::record(timestamp_ns begin, duration_ns handler, int64_t mailbox_depth) {
  const int64_t epoch = begin / slot_ns;
  std::lock_guard lock(mutex_);
  slot& s = slots_[static_cast<size_t>(epoch % num_slots)];
  if (s.epoch != epoch) {
    s.epoch = epoch;
    s.num_messages = 0;
    s.busy_ns = 0;
    s.depth_sum = 0;
    s.handler_times.clear();
  }
  ++s.num_messages;
  s.busy_ns += handler;
  s.depth_sum += mailbox_depth;
  s.handler_times.add(handler);
  ++num_messages_;
  last_depth_ = mailbox_depth;
  max_depth_ = std::max(max_depth_, mailbox_depth);
  last_end_ = begin + handler;
}

actor_stats_snapshot actor_stats::snapshot(timestamp_ns now) const {
  const int64_t now_epoch = now / slot_ns;
  actor_stats_snapshot out;
  handler_time_histogram times;
  int64_t num_recent = 0;
  duration_ns busy = 0;
  int64_t depth_sum = 0;
  std::lock_guard lock(mutex_);
  for (const slot& s : slots_) {
    // The slot of `now` and the nine before it: the last second, give or take a slot's part.
    if (s.epoch < 0 || s.epoch > now_epoch || s.epoch <= now_epoch - num_slots) continue;
    num_recent += s.num_messages;
    busy += s.busy_ns;
    depth_sum += s.depth_sum;
    times.add(s.handler_times);
  }
  constexpr double window_s = static_cast<double>(slot_ns) * num_slots / 1e9;
  out.num_messages = num_messages_;
  out.mailbox_depth = last_depth_;
  out.max_mailbox_depth = max_depth_;
  out.messages_per_s = static_cast<double>(num_recent) / window_s;
  // A handler longer than the window counts whole in its first slot: a share above 1 is that.
  out.busy_share = std::min(1.0, static_cast<double>(busy) / 1e9 / window_s);
  out.handler_p50_us = times.quantile_us(0.5);
  out.handler_p99_us = times.quantile_us(0.99);
  if (num_recent > 0) {
    out.mean_mailbox_depth = static_cast<double>(depth_sum) / static_cast<double>(num_recent);
    out.estimated_wait_ms = out.mean_mailbox_depth / out.messages_per_s * 1000.0;
  }
  if (last_end_ >= 0) out.since_last_s = std::max<double>(0, static_cast<double>(now - last_end_) / 1e9);
  return out;
}

}  // namespace troupe
