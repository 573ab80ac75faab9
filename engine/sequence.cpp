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
                   std::span<const int32_t> resumed_output_ids, kv_handoff kv, service_targets targets)
    : request_id_(request_id),
      token_ids_(std::move(prompt_ids)),
      num_prompt_tokens_(static_cast<int>(token_ids_.size())),
      num_resumed_output_tokens_(static_cast<int>(resumed_output_ids.size())),
      params_(std::move(params)),
      kv_(kv),
      priority_(priority),
      arrival_order_(arrival_order),
      targets_(std::move(targets)) {
  if (token_ids_.empty()) {
    throw std::runtime_error("sequence: request " + std::to_string(request_id) + " has an empty prompt");
  }
  token_ids_.insert(token_ids_.end(), resumed_output_ids.begin(), resumed_output_ids.end());
  timeline_.arrival = arrival;
}

void sequence::require(bool holds, const char* transition, const char* condition) const {
  if (holds) return;
  throw std::logic_error("sequence " + std::to_string(request_id_) + ": " + transition + " needs " + condition +
                         " (status " + std::string(sequence_status_name(status_)) + ")");
}

void sequence::append_token(int32_t token_id, engine_clock::time_point now) {
  if (num_output_tokens() == num_resumed_output_tokens_) timeline_.first_token = now;
  token_ids_.push_back(token_id);
  timeline_.last_token = now;
}

void sequence::admit(int num_cached_tokens, uint64_t step_id, engine_clock::time_point now) {
  const bool queued = status_ == sequence_status::waiting || status_ == sequence_status::preempted;
  require(queued, "admit", "a waiting or preempted sequence");
  require(num_cached_tokens >= 0 && num_cached_tokens <= num_tokens(), "admit", "a prefix hit within its tokens");
  require(num_inflight_tokens_ == 0 && num_pending_samples_ == 0, "admit", "no step in flight for it");
  num_computed_tokens_ = num_cached_tokens;
  if (!timeline_.scheduled) {
    timeline_.scheduled = true;
    timeline_.first_scheduled = now;
    // Usage counts cached tokens among the prompt's; a resumed request's hit may go further.
    num_cached_tokens_ = std::min(num_cached_tokens, num_prompt_tokens_);
  }
  status_ = sequence_status::running;
  admitted_step_ = step_id;
}

void sequence::reserve_kv(int num_kv_tokens, engine_clock::time_point now) {
  require(status_ == sequence_status::waiting && kv_.role == kv_role::receive, "reserve_kv",
          "a waiting role receive sequence");
  require(num_kv_tokens > 0 && num_kv_tokens <= num_tokens(), "reserve_kv", "a reservation within its tokens");
  num_kv_tokens_ = num_kv_tokens;
  status_ = sequence_status::waiting_for_kv;
  if (!timeline_.scheduled) {
    timeline_.scheduled = true;
    timeline_.first_scheduled = now;
  }
}

void sequence::planned(const scheduled_sequence& entry) {
  require(status_ == sequence_status::running, "planned", "a running sequence");
  require(entry.request_id == request_id_, "planned", "an entry for its own request");
  require(entry.num_computed_tokens == num_scheduled_tokens(), "planned", "an entry that starts where it was planned");
  num_inflight_tokens_ += entry.num_new_tokens();
  num_blocks_on_worker_ = entry.block_table_start + static_cast<int>(entry.block_table.size());
  known_to_worker_ = true;
  if (entry.sample) ++num_pending_samples_;
}

void sequence::chunk_computed(int num_new_tokens) {
  require(status_ == sequence_status::running, "chunk_computed", "a running sequence");
  require(num_new_tokens >= 0 && num_new_tokens <= num_inflight_tokens_, "chunk_computed",
          "at most its tokens in flight");
  num_computed_tokens_ += num_new_tokens;
  num_inflight_tokens_ -= num_new_tokens;
}

void sequence::sample_returned(int num_new_tokens, int num_drafts, int num_verified,
                               std::span<const sampled_token> outputs, engine_clock::time_point now) {
  require(status_ == sequence_status::running, "sample_returned", "a running sequence");
  require(num_new_tokens >= 0 && num_new_tokens <= num_inflight_tokens_, "sample_returned",
          "at most its tokens in flight");
  require(num_pending_samples_ > 0, "sample_returned", "a sample pending");
  require(num_verified >= 1 && num_drafts >= num_verified - 1, "sample_returned",
          "one token and at most its drafts' worth more");
  require(!outputs.empty() && static_cast<int>(outputs.size()) <= num_verified, "sample_returned",
          "outputs among the tokens that came back");
  // The accepted drafts' K/V is in the pool as well; the rejected slots are rolled back.
  num_computed_tokens_ += num_new_tokens + num_verified - 1;
  num_inflight_tokens_ -= num_new_tokens;
  --num_pending_samples_;
  ++num_sampling_steps_;
  num_draft_tokens_ += num_drafts;
  for (const sampled_token& token : outputs) append_token(token.token_id, now);
  // Drafts after a token that ended the request never became outputs: they do not count as
  // accepted, and their K/V does not count as computed.
  num_accepted_tokens_ += static_cast<int>(outputs.size()) - 1;
  num_computed_tokens_ = std::min(num_computed_tokens_, num_tokens() - 1);
}

void sequence::kv_complete() {
  require(status_ == sequence_status::waiting_for_kv, "kv_complete", "a sequence waiting for its KV");
  kv_arrived_ = true;
}

void sequence::hand_over(std::span<const int32_t> token_ids, engine_clock::time_point now) {
  require(kv_.role == kv_role::receive && !handed_off_, "hand_over", "a role receive sequence not handed over yet");
  require(!token_ids.empty(), "hand_over", "at least one token");
  for (int32_t token_id : token_ids) append_token(token_id, now);
  num_handed_over_tokens_ += static_cast<int>(token_ids.size());
  handed_off_ = true;
}

void sequence::start_from_kv(uint64_t step_id) {
  require(status_ == sequence_status::waiting_for_kv && ready_to_start(), "start_from_kv",
          "its KV arrived and its tokens handed over");
  // The pool holds the prompt's (and resumed outputs') KV; the handed-over token is the next
  // step's input, as a decode's always is.
  num_computed_tokens_ = num_kv_tokens_;
  status_ = sequence_status::running;
  admitted_step_ = step_id;
}

void sequence::preempt() {
  require(status_ == sequence_status::running, "preempt", "a running sequence");
  num_computed_tokens_ = 0;
  num_inflight_tokens_ = 0;  // what steps in flight compute for it is discarded
  num_pending_samples_ = 0;
  num_blocks_on_worker_ = 0;  // its blocks are freed: the next plan sends the new table whole
  ++num_preemptions_;
  status_ = sequence_status::preempted;
}

void sequence::finish(sequence_status finished_status, engine_clock::time_point now) {
  require(is_finished(finished_status), "finish", "a finished_* status");
  require(!is_finished(status_), "finish", "a sequence not finished yet");
  status_ = finished_status;
  timeline_.finish = now;
}

request_metrics sequence::metrics() const {
  request_metrics m;
  m.num_prompt_tokens = num_prompt_tokens_;
  m.num_output_tokens = num_output_tokens();
  m.num_cached_tokens = num_cached_tokens_;
  m.num_preemptions = num_preemptions_;
  m.num_draft_tokens = num_draft_tokens_;
  m.num_accepted_tokens = num_accepted_tokens_;
  m.num_sampling_steps = num_sampling_steps_;
  if (timeline_.scheduled) m.queue_time = seconds(timeline_.first_scheduled - timeline_.arrival);
  // The times are this engine's: a resumed request's first token is its first new one.
  const int num_new = m.num_output_tokens - num_resumed_output_tokens_;
  if (num_new > 0) {
    m.ttft = seconds(timeline_.first_token - timeline_.arrival);
    if (num_new > 1) m.tpot = seconds(timeline_.last_token - timeline_.first_token) / (num_new - 1);
  }
  if (is_finished(status_)) m.e2e = seconds(timeline_.finish - timeline_.arrival);
  return m;
}

}  // namespace troupe
