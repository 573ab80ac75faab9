#pragma once
// The latencies and totals of served requests, both doors together, for /metrics: time to first
// token, time per output token, inter-token latency, end-to-end latency and queue time as
// histograms; prompt and generation tokens, finished requests by reason and preemptions as
// counters; speculative decoding's drafts, accepted drafts, sampling steps and tokens per step.
// Named and bucketed as vLLM's, so dashboards built for it read ours
// (doors/http/metrics_text renders them).
//
// The frontend feeds it as it routes replies to the doors: ttft, itl, tpot and e2e are measured
// here, on the controller's one clock, from the request entering the stages (arrived) to its
// deltas passing; queue time and preemptions come from the final delta (the scheduler's).
// Thread-safe: doors report arrivals from their threads, the frontend reports deltas.

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "doors/latency_histogram.hpp"
#include "doors/request_trace_log.hpp"
#include "doors/speculative_usage.hpp"
#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

// The histograms' upper bounds, in seconds.
std::vector<double> first_token_bounds();
std::vector<double> per_token_bounds();
std::vector<double> request_bounds();
// Tokens per step of a speculating request: 1 (no draft accepted) to 1 + the most drafts (16).
std::vector<double> tokens_per_step_bounds();

struct serving_metrics_snapshot {
  latency_histogram time_to_first_token{first_token_bounds()};
  latency_histogram time_per_output_token{per_token_bounds()};
  latency_histogram inter_token_latency{per_token_bounds()};
  latency_histogram e2e_request_latency{request_bounds()};
  latency_histogram request_queue_time{request_bounds()};
  uint64_t num_prompt_tokens = 0;
  uint64_t num_generation_tokens = 0;
  uint64_t num_preemptions = 0;
  uint64_t num_finished_stop = 0;
  uint64_t num_finished_length = 0;
  uint64_t num_finished_abort = 0;
  // Speculative decoding, over every finished request (sampling steps too for those that never
  // speculated, so generation tokens / steps compares runs with it on and off).
  speculative_tally speculative;
  // Per finished request that had drafts verified: its output tokens per sampling step.
  latency_histogram tokens_per_step{tokens_per_step_bounds()};
};

class serving_metrics {
 public:
  // The request entered the stages at `now`.
  void arrived(int64_t request_id, timestamp_ns now);
  // A delta of it passed toward its door at `now`. Returns the request's record once it
  // finished (for the trace log); a request never reported as arrived is counted, not timed.
  std::optional<request_record> observe(const text_delta& d, timestamp_ns now);
  // It failed: no latency of it is observed. Returns what was known of it (its arrival and
  // first token, for the access log), nullopt for a request never reported as arrived.
  std::optional<request_record> forget(int64_t request_id);

  serving_metrics_snapshot snapshot() const;
  size_t num_live() const;

 private:
  struct live_request {
    timestamp_ns arrival = 0;
    timestamp_ns first_token = 0;  // 0 before
    timestamp_ns last_token = 0;
  };

  mutable std::mutex mutex_;
  std::unordered_map<int64_t, live_request> live_;
  serving_metrics_snapshot totals_;
};

}  // namespace troupe
