#pragma once
// The timelines of recently finished requests, for traces (GET /debug/trace): a bounded ring of
// records (the oldest is dropped when it is full). Thread-safe: the frontend adds, a door reads.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "engine/request_status.hpp"
#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

// One finished request. The stamps are the controller's clock, where its replies are routed to
// the doors; `timeline` holds the stages' durations, each on its own stage's clock.
struct request_record {
  int64_t request_id = 0;
  timestamp_ns arrival = 0;      // entered the stages
  timestamp_ns first_token = 0;  // its first delta with tokens (or its final one, with none)
  timestamp_ns finish = 0;       // its final delta
  finish_reason finish_reason_value = finish_reason::none;
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
  int num_preemptions = 0;
  int num_draft_tokens = 0;     // speculative decoding: drafts verified for it
  int num_accepted_tokens = 0;  // and accepted
  request_timeline timeline;
};

class request_trace_log {
 public:
  static constexpr size_t default_capacity = 8192;

  explicit request_trace_log(size_t capacity = default_capacity) : capacity_(capacity) {}

  void add(request_record record);
  // The requests that finished at or after `since`, oldest first.
  std::vector<request_record> finished_since(timestamp_ns since) const;

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<request_record> records_;  // in finishing order
};

}  // namespace troupe
