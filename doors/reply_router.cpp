#include "doors/reply_router.hpp"

#include "doors/access_log.hpp"
#include "doors/operator_log.hpp"

namespace troupe {

void reply_router::count(const text_delta& d) {
  counters_.num_output_tokens_routed += d.delta.token_ids.size();
  if (!d.delta.finished()) return;
  if (d.delta.metrics) {
    counters_.num_prompt_tokens += static_cast<uint64_t>(d.delta.metrics->num_prompt_tokens);
    counters_.num_generation_tokens += static_cast<uint64_t>(d.delta.metrics->num_output_tokens);
  }
  switch (d.delta.finish) {
    case finish_reason::stop: ++counters_.num_finished_stop; break;
    case finish_reason::length: ++counters_.num_finished_length; break;
    case finish_reason::abort: ++counters_.num_finished_abort; break;
    default: break;
  }
}

void reply_router::observe(const text_delta& d, timestamp_ns now) {
  auto record = counters_.metrics.observe(d, now);
  if (!record) return;
  if (access_log_) {
    record->timeline.instance = d.timeline.instance;
    log_access(*record, std::string(finish_reason_name(d.delta.finish)), {}, now);
  }
  counters_.requests.add(std::move(*record));
}

void reply_router::log_access(const request_record& record, const std::string& finish, const std::string& error,
                              timestamp_ns now) {
  access_entry entry;
  entry.request_id = record.request_id;
  entry.door = request_admission::door_of(record.request_id);
  entry.num_prompt_tokens = record.num_prompt_tokens;
  entry.num_output_tokens = record.num_output_tokens;
  if (record.arrival > 0) {
    entry.total_ms = static_cast<double>(now - record.arrival) / 1e6;
    if (record.first_token > 0) entry.ttft_ms = static_cast<double>(record.first_token - record.arrival) / 1e6;
  }
  entry.finish = finish;
  entry.error = error;
  entry.instance = record.timeline.instance;
  emit_structured("access", access_log_text(entry), access_log_fields(entry));
}

void reply_router::route(text_batch batch) {
  // The common case, one door's requests only, moves the batch on whole.
  std::array<text_batch, num_client_doors> by_door;
  const timestamp_ns now = steady_now_ns();
  for (auto& d : batch.deltas) {
    count(d);
    observe(d, now);
    if (d.delta.finished()) untrack(d.delta.request_id);
    by_door[static_cast<int>(request_admission::door_of(d.delta.request_id))].deltas.push_back(std::move(d));
  }
  for (int door = 0; door < num_client_doors; ++door) {
    if (!by_door[door].deltas.empty() && doors_[door]) doors_[door]->post(std::move(by_door[door]));
  }
}

void reply_router::route(request_failed failed) {
  ++counters_.num_failed;
  std::optional<request_record> known = counters_.metrics.forget(failed.request_id);
  if (access_log_) {
    if (!known) {
      known.emplace();
      known->request_id = failed.request_id;
    }
    log_access(*known, "error", std::string(error_code_name(failed.code)) + ": " + failed.message, steady_now_ns());
  }
  untrack(failed.request_id);
  if (auto* inbox = doors_[static_cast<int>(request_admission::door_of(failed.request_id))]) {
    inbox->post(std::move(failed));
  }
}

void reply_router::route(stats_answer stats) {
  if (stats.tag == operator_stats_tag) {
    if (operator_stats_) operator_stats_(stats);
    return;
  }
  if (auto* inbox = doors_[static_cast<int>(request_admission::door_of_tag(stats.tag))]) {
    inbox->post(std::move(stats));
  }
}

void reply_router::route(trace_answer trace) {
  if (auto* inbox = doors_[static_cast<int>(request_admission::door_of_tag(trace.tag))]) {
    inbox->post(std::move(trace));
  }
}

bool reply_router::track(int64_t request_id) {
  {
    std::lock_guard lock(tracked_mutex_);
    if (failed_) return false;
    tracked_.insert(request_id);
  }
  counters_.metrics.arrived(request_id, steady_now_ns());
  return true;
}

bool reply_router::tracks(int64_t request_id) const {
  std::lock_guard lock(tracked_mutex_);
  return tracked_.count(request_id) != 0;
}

void reply_router::untrack(int64_t request_id) {
  std::lock_guard lock(tracked_mutex_);
  tracked_.erase(request_id);
}

size_t reply_router::fail_all(error_code code, const std::string& message) {
  std::unordered_set<int64_t> ids;
  {
    std::lock_guard lock(tracked_mutex_);
    failed_ = true;
    ids.swap(tracked_);
  }
  for (int64_t id : ids) route(request_failed{id, code, message});
  return ids.size();
}

void reply_router::serve_again() {
  std::lock_guard lock(tracked_mutex_);
  failed_ = false;
}

bool reply_router::refusing() const {
  std::lock_guard lock(tracked_mutex_);
  return failed_;
}

size_t reply_router::num_tracked() const {
  std::lock_guard lock(tracked_mutex_);
  return tracked_.size();
}

}  // namespace troupe
