#pragma once
// GET /metrics: the server's counters and the scheduler's gauges in Prometheus' text exposition
// format (version 0.0.4).

#include <cstdint>
#include <optional>
#include <string>

namespace troupe {

struct metrics_snapshot {
  uint64_t num_requests_zmq = 0;  // admitted, per door
  uint64_t num_requests_http = 0;
  uint64_t num_refused_zmq = 0;   // refused by the shared in-flight bound, per door
  uint64_t num_refused_http = 0;
  int64_t num_requests_in_flight = 0;
  int64_t max_requests_in_flight = 0;
  uint64_t num_prompt_tokens = 0;
  uint64_t num_generation_tokens = 0;
  uint64_t num_finished_stop = 0;
  uint64_t num_finished_length = 0;
  uint64_t num_finished_abort = 0;
  uint64_t num_failed = 0;
  uint64_t num_http_responses_2xx = 0;
  uint64_t num_http_responses_4xx = 0;
  uint64_t num_http_responses_5xx = 0;
  int64_t num_http_streams_open = 0;
  // The scheduler's answer to a stats query; absent when it did not answer in time.
  struct scheduler_gauges {
    int num_free_blocks = 0;
    int num_total_blocks = 0;
    int num_running = 0;
    int num_waiting = 0;
  };
  std::optional<scheduler_gauges> scheduler;
};

std::string render_metrics(const metrics_snapshot& m);

}  // namespace troupe
