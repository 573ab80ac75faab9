#include "engine/sequence.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {
double seconds(engine_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

sequence::sequence(int64_t request_id, std::vector<int32_t> prompt_ids, sampling_params params, int priority,
                   uint64_t arrival_order, engine_clock::time_point arrival,
                   std::span<const int32_t> resumed_output_ids, kv_handoff kv)
    : request_id_(request_id),
      token_ids_(std::move(prompt_ids)),
      num_prompt_tokens_(static_cast<int>(token_ids_.size())),
      num_resumed_output_tokens_(static_cast<int>(resumed_output_ids.size())),
      params_(std::move(params)),
      kv_(kv),
      priority_(priority),
      arrival_order_(arrival_order) {
  if (token_ids_.empty()) {
    throw std::runtime_error("sequence: request " + std::to_string(request_id) + " has an empty prompt");
  }
  token_ids_.insert(token_ids_.end(), resumed_output_ids.begin(), resumed_output_ids.end());
  timeline.arrival = arrival;
}

void sequence::append_token(int32_t token_id, engine_clock::time_point now) {
  if (num_output_tokens() == num_resumed_output_tokens_) timeline.first_token = now;
  token_ids_.push_back(token_id);
  timeline.last_token = now;
}

void sequence::finish(sequence_status finished_status, engine_clock::time_point now) {
  if (!is_finished(finished_status)) {
    throw std::runtime_error("sequence: finish needs a finished_* status");
  }
  status = finished_status;
  timeline.finish = now;
}

void sequence::reset_for_recompute() {
  num_computed_tokens = 0;
  num_inflight_tokens = 0;  // what steps in flight compute for it is discarded
  num_pending_samples = 0;
  num_blocks_on_worker = 0;  // its blocks are freed: the next plan sends the new table whole
  ++num_preemptions;
  status = sequence_status::preempted;
}

request_metrics sequence::metrics() const {
  request_metrics m;
  m.num_prompt_tokens = num_prompt_tokens_;
  m.num_output_tokens = num_output_tokens();
  m.num_cached_tokens = num_cached_tokens;
  m.num_preemptions = num_preemptions;
  m.num_draft_tokens = num_draft_tokens;
  m.num_accepted_tokens = num_accepted_tokens;
  m.num_sampling_steps = num_sampling_steps;
  if (timeline.scheduled) m.queue_time = seconds(timeline.first_scheduled - timeline.arrival);
  // The times are this engine's: a resumed request's first token is its first new one.
  const int num_new = m.num_output_tokens - num_resumed_output_tokens_;
  if (num_new > 0) {
    m.ttft = seconds(timeline.first_token - timeline.arrival);
    if (num_new > 1) m.tpot = seconds(timeline.last_token - timeline.first_token) / (num_new - 1);
  }
  if (is_finished(status)) m.e2e = seconds(timeline.finish - timeline.arrival);
  return m;
}

}  // namespace troupe
