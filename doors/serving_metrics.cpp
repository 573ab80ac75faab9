#include "doors/serving_metrics.hpp"

namespace troupe {

namespace {

double seconds(duration_ns d) { return static_cast<double>(d) / 1e9; }

}  // namespace

// vLLM's bounds, with finer ones below 10 ms in front: a small model on a CPU answers in
// milliseconds, and percentiles interpolated inside one coarse bucket would say nothing.
std::vector<double> first_token_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,   0.25,  0.5,
          0.75,   1.0,   2.5,    5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> per_token_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2, 0.3,
          0.4,    0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
}
std::vector<double> tokens_per_step_bounds() {
  return {1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 14.0, 17.0};
}
std::vector<double> request_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
          5.0,   10.0,   15.0,  20.0, 30.0,  40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

void serving_metrics::arrived(int64_t request_id, timestamp_ns now) {
  std::lock_guard lock(mutex_);
  live_[request_id] = live_request{now, 0, 0};
}

std::optional<request_record> serving_metrics::observe(const text_delta& d, timestamp_ns now) {
  const bool finished = d.delta.finished();
  const bool has_tokens = !d.delta.token_ids.empty();
  std::lock_guard lock(mutex_);
  auto it = live_.find(d.delta.request_id);
  if (it != live_.end() && (has_tokens || finished)) {
    live_request& r = it->second;
    if (r.first_token == 0) {
      // A request that ends with no token (aborted in the queue) had its first reply at its end.
      r.first_token = now;
      totals_.time_to_first_token.observe(seconds(now - r.arrival));
    } else if (has_tokens) {
      totals_.inter_token_latency.observe(seconds(now - r.last_token));
    }
    if (has_tokens) r.last_token = now;
  }
  if (!finished) return std::nullopt;

  request_record record;
  record.request_id = d.delta.request_id;
  record.finish = now;
  record.finish_reason_value = d.delta.finish;
  record.timeline = d.timeline;
  switch (d.delta.finish) {
    case finish_reason::stop: ++totals_.num_finished_stop; break;
    case finish_reason::length: ++totals_.num_finished_length; break;
    case finish_reason::abort: ++totals_.num_finished_abort; break;
    default: break;
  }
  if (d.delta.metrics) {
    const request_metrics& m = *d.delta.metrics;
    totals_.num_prompt_tokens += static_cast<uint64_t>(m.num_prompt_tokens);
    totals_.num_generation_tokens += static_cast<uint64_t>(m.num_output_tokens);
    totals_.num_preemptions += static_cast<uint64_t>(m.num_preemptions);
    record.num_prompt_tokens = m.num_prompt_tokens;
    record.num_output_tokens = m.num_output_tokens;
    record.num_preemptions = m.num_preemptions;
    record.num_draft_tokens = m.num_draft_tokens;
    record.num_accepted_tokens = m.num_accepted_tokens;
    totals_.speculative.add(m);
    if (m.num_draft_tokens > 0 && m.num_sampling_steps > 0) {
      totals_.tokens_per_step.observe(static_cast<double>(num_generated_here(m)) / m.num_sampling_steps);
    }
  }
  if (it == live_.end()) return std::nullopt;
  const live_request r = it->second;
  live_.erase(it);
  record.arrival = r.arrival;
  record.first_token = r.first_token;
  totals_.e2e_request_latency.observe(seconds(now - r.arrival));
  // The scheduler's segment: arrival at the scheduler -> first scheduled (0 for a request that
  // never was, e.g. aborted in the queue, which then has no queue time to tell).
  if (d.delta.metrics && d.timeline.num_steps > 0) totals_.request_queue_time.observe(seconds(d.timeline.queue_ns));
  if (record.num_output_tokens > 1) {
    totals_.time_per_output_token.observe(seconds(now - r.first_token) / (record.num_output_tokens - 1));
  }
  return record;
}

std::optional<request_record> serving_metrics::forget(int64_t request_id) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(request_id);
  if (it == live_.end()) return std::nullopt;
  request_record known;
  known.request_id = request_id;
  known.arrival = it->second.arrival;
  known.first_token = it->second.first_token;
  live_.erase(it);
  return known;
}

serving_metrics_snapshot serving_metrics::snapshot() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

size_t serving_metrics::num_live() const {
  std::lock_guard lock(mutex_);
  return live_.size();
}

}  // namespace troupe
