#pragma once
// Sends each reply event to the door its request came through (the door is in the request id,
// see request_admission) and counts what finished requests used, for /metrics. Plain class; the
// frontend actor calls it, one event at a time.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>

#include "doors/door_events.hpp"
#include "doors/request_admission.hpp"
#include "doors/request_trace_log.hpp"
#include "doors/serving_metrics.hpp"

namespace troupe {

// Totals over every finished request of both doors. Read from any thread.
struct serving_counters {
  std::atomic<uint64_t> num_prompt_tokens{0};
  std::atomic<uint64_t> num_generation_tokens{0};
  std::atomic<uint64_t> num_finished_stop{0};
  std::atomic<uint64_t> num_finished_length{0};
  std::atomic<uint64_t> num_finished_abort{0};
  std::atomic<uint64_t> num_failed{0};
  // Output tokens as they pass to the doors (the totals above count a request at its end): the
  // throughput line's generation rate, which must not wait for long requests to end.
  std::atomic<uint64_t> num_output_tokens_routed{0};
  // Latencies and totals of the troupe: families, and the timelines of finished requests.
  serving_metrics metrics;
  request_trace_log requests;
};

class reply_router {
 public:
  // A door left unset (nullptr) drops its events: it was not started.
  void set_door(client_door door, door_inbox* inbox) { doors_[static_cast<int>(door)] = inbox; }

  void route(text_batch batch);
  void route(request_failed failed);
  void route(stats_answer stats);
  void route(trace_answer trace);

  const serving_counters& counters() const { return counters_; }

  // The access log (doors/access_log.hpp): one line per finished or failed request, on or off.
  // Set before serving starts.
  void set_access_log(bool on) { access_log_ = on; }
  // Stats answers tagged operator_stats_tag (no door issues it: door tags start at 1) go to
  // `listener` instead of a door: the periodic throughput line's. Set before serving starts.
  static constexpr uint64_t operator_stats_tag = 0;
  void set_operator_stats_listener(std::function<void(const stats_answer&)> listener) {
    operator_stats_ = std::move(listener);
  }

  // The requests inside the stages, so that a node whose stage failed can end each of them with
  // an error instead of leaving its client waiting. Thread-safe: doors track from their threads,
  // the frontend actor routes. A request is tracked from its submission to its final delta or
  // its request_failed.
  // Notes a request entering the stages; false once fail_all has run (the caller refuses it).
  bool track(int64_t request_id);
  // Ends every tracked request with request_failed{code, message}, and makes track refuse every
  // request from now on. Returns how many were ended.
  size_t fail_all(error_code code, const std::string& message);
  size_t num_tracked() const;
  // Whether the request is inside the stages: its client has not had its end yet.
  bool tracks(int64_t request_id) const;
  // True once fail_all has run: every request is refused from then on, until serve_again.
  bool refusing() const;
  // Takes requests again after fail_all (the failed stage was replaced: a node came back).
  void serve_again();

 private:
  void count(const text_delta& d);
  void observe(const text_delta& d, timestamp_ns now);
  void untrack(int64_t request_id);
  void log_access(const request_record& record, const std::string& finish, const std::string& error, timestamp_ns now);

  std::array<door_inbox*, num_client_doors> doors_{};
  serving_counters counters_;
  mutable std::mutex tracked_mutex_;
  std::unordered_set<int64_t> tracked_;
  bool failed_ = false;  // set by fail_all, under tracked_mutex_
  bool access_log_ = false;
  std::function<void(const stats_answer&)> operator_stats_;
};

}  // namespace troupe
