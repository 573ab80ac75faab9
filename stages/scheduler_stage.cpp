#include "stages/scheduler_stage.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include <spdlog/spdlog.h>

#include "engine/process_cpu.hpp"
#include "pipeline/stage_health.hpp"
#include "pipeline/stage_load.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

constexpr size_t max_early_aborts = 4096;
constexpr size_t max_handed_off = 4096;

}  // namespace

scheduler_stage::scheduler_stage(const engine_config& config, std::vector<int32_t> eos_token_ids,
                                 std::chrono::milliseconds pipeline_failover_wait)
    : scheduler_(config, std::move(eos_token_ids)),
      max_in_flight_(config.async_scheduling ? 2 : 1),
      pipeline_failover_wait_(pipeline_failover_wait) {}

void scheduler_stage::emit(outputs& out, token_delta delta) {
  // One lookup per delta: the run it belongs to, and on its last delta here its timeline.
  const auto tracked = timelines_.find(delta.request_id);
  if (tracked != timelines_.end()) delta.attempt = tracked->second.attempt;
  request_timeline timeline;
  if (delta.handed_off) {
    if (tracked != timelines_.end()) timelines_.erase(tracked);
    if (handed_off_.insert(delta.request_id).second) handed_off_order_.push_back(delta.request_id);
    while (handed_off_order_.size() > max_handed_off) {
      handed_off_.erase(handed_off_order_.front());
      handed_off_order_.pop_front();
    }
  } else if (delta.finished() && tracked != timelines_.end()) {
    timeline = tracked->second.timeline;
    timelines_.erase(tracked);
  }
  out.tokens.deltas.push_back(std::move(delta));
  out.tokens.timelines.push_back(timeline);
}

scheduler_stage::outputs scheduler_stage::add(schedule_request request) {
  outputs out;
  if (early_aborts_.erase(request.request_id)) {
    token_delta aborted;
    aborted.request_id = request.request_id;
    aborted.attempt = request.attempt;
    aborted.finish = finish_reason::abort;
    request_metrics metrics;
    metrics.num_prompt_tokens = static_cast<int>(request.prompt_ids.size());
    metrics.num_output_tokens = static_cast<int>(request.resumed_output_ids.size());
    aborted.metrics = metrics;
    emit(out, std::move(aborted));
    return out;
  }
  // The engine measures queue time, ttft and e2e from now, on this stage's clock: the door's
  // arrival stamp belongs to another process, perhaps another host.
  const timestamp_ns received = steady_now_ns();
  if (auto error =
          scheduler_.add_request(request.request_id, std::move(request.prompt_ids), std::move(request.sampling),
                                 request.priority, engine_clock::time_point(std::chrono::nanoseconds(received)),
                                 request.resumed_output_ids, request.kv, request.targets)) {
    out.refusals.push_back(request_failed{request.request_id, error->code, error->message});
    return out;
  }
  handed_off_.erase(request.request_id);  // a new run of the id: its aborts are its own
  tracked_timeline& tracked = timelines_[request.request_id];
  tracked.received = received;
  tracked.timeline.tokenize_ns = request.tokenize_ns;
  tracked.attempt = request.attempt;
  plan_next(out);
  return out;
}

scheduler_stage::outputs scheduler_stage::abort(int64_t request_id, bool quietly) {
  outputs out;
  const sequence* seq = scheduler_.find(request_id);
  if (seq != nullptr && seq->status() == sequence_status::waiting_for_kv)
    out.kv_cancels.push_back(seq->kv().transfer_id);
  if (quietly) {
    if (scheduler_.abort(request_id)) timelines_.erase(request_id);
    handed_off_.erase(request_id);
    plan_next(out);  // its blocks are free for the queue
    return out;
  }
  if (auto delta = scheduler_.abort(request_id)) {
    emit(out, std::move(*delta));
  } else if (handed_off_.erase(request_id)) {
    // Handed off before the abort came: nothing of it is here.
  } else if (early_aborts_.insert(request_id).second) {
    early_abort_order_.push_back(request_id);
    while (early_abort_order_.size() > max_early_aborts) {
      early_aborts_.erase(early_abort_order_.front());
      early_abort_order_.pop_front();
    }
  }
  return out;
}

scheduler_stage::outputs scheduler_stage::stop(int64_t request_id) {
  outputs out;
  // An unknown id already finished (its final delta is on its way to the detokenizer).
  const sequence* seq = scheduler_.find(request_id);
  if (seq != nullptr && seq->status() == sequence_status::waiting_for_kv)
    out.kv_cancels.push_back(seq->kv().transfer_id);
  if (auto delta = scheduler_.stop(request_id)) emit(out, std::move(*delta));
  plan_next(out);
  return out;
}

scheduler_stage::outputs scheduler_stage::step_finished(const step_done& done) {
  outputs out;
  // The worker answers in plan order, so this is the oldest step's answer; one naming another
  // step is malformed (check_result says so below), not to be dropped: its requests would hang.
  if (in_flight_.empty()) return out;
  step_outline plan = std::move(in_flight_.front());
  in_flight_.pop_front();
  const timestamp_ns now = steady_now_ns();
  const duration_ns elapsed = steps_.finished(plan, now, done.compute_ns);
  // What the step held the engine for, as this stage saw it: the worker's compute plus the
  // messages to it and back and whatever shared the machine meanwhile. Requests wait that long,
  // so the slo policy and `troupe plan` must predict that, not the compute alone (which left a
  // 15 % shortfall in every latency the plan predicted on a 2-core machine).
  if (done.error.empty()) {
    scheduler_.observe_step(plan, static_cast<double>(elapsed > 0 ? elapsed : done.compute_ns) * 1e-9);
  }
  for (const auto& seq : plan.sequences) {
    auto it = timelines_.find(seq.request_id);
    if (it == timelines_.end()) continue;
    auto& t = it->second.timeline;
    if (t.num_steps++ == 0) {
      t.first_step_done_ns = now - it->second.received;
      t.first_step_compute_ns = done.compute_ns;
    }
    t.last_step_done_ns = now - it->second.received;
  }
  std::string failure;
  if (!done.error.empty()) {
    failure = "the worker failed a step: " + done.error;
  } else if (auto why = scheduler_.check_result(plan, done.result)) {
    // Refused whole, before anything changed: applying part of it would corrupt other requests.
    failure = "the worker returned a malformed step result: " + *why;
  }
  if (!failure.empty()) {
    // The step's requests cannot trust their KV any more. Nor can a later request trust a cached
    // prefix: the step may have written part of a block's KV, and a pipeline stage that restarted
    // lost every block's KV of its layers.
    if (const int forgotten = scheduler_.forget_cached_prefixes(); forgotten > 0) {
      spdlog::info("scheduler: forgot {} cached prefix blocks after a failed step", forgotten);
    }
    if (done.stage_lost && pipeline_failover_wait_.count() > 0) {
      // Not the requests' fault: they run again from their tokens once the stage is back. Every
      // running one, not only this step's: the stage's KV of all of them is gone.
      if (lost_stage_since_ == 0) {
        lost_stage_since_ = now;
        lost_stage_cause_ = done.error;
      }
      const int requeued = scheduler_.recompute_all_running();
      spdlog::warn(
          "scheduler: step {} lost a pipeline stage ({}); {} running requests wait to run again from their "
          "tokens, for at most {} ms",
          plan.step_id, done.error, requeued, pipeline_failover_wait_.count());
      plan_next(out);  // holds while the stage is down; tick() plans once it is back
      return out;
    }
    for (const auto& seq : plan.sequences) {
      // Put back by a lost stage since this step was planned: its KV is gone anyway, and it
      // runs again once the stage is back (this step's failure is a consequence of the loss).
      const sequence* live = scheduler_.find(seq.request_id);
      if (lost_stage_since_ != 0 && live != nullptr && live->status() != sequence_status::running) continue;
      if (scheduler_.abort(seq.request_id)) {
        timelines_.erase(seq.request_id);
        out.tokens.failures.push_back(request_failed{seq.request_id, error_code::internal, failure});
      }
    }
  } else {
    lost_stage_since_ = 0;  // the pipeline computes again
    lost_stage_cause_.clear();
    // A request the worker failed alone (a logits plugin): ended first, so the update skips its token.
    for (const failed_request& f : done.result.failed) {
      if (scheduler_.abort(f.request_id)) {
        timelines_.erase(f.request_id);
        out.tokens.failures.push_back(request_failed{f.request_id, error_code::internal, f.why});
      }
    }
    for (auto& delta : scheduler_.update(plan, done.result)) emit(out, std::move(delta));
  }
  plan_next(out);
  return out;
}

scheduler_stage::outputs scheduler_stage::kv_arrived(const kv_arrival_msg& arrival) {
  outputs out;
  if (arrival.ok) {
    if (scheduler_.kv_arrived(arrival.request_id, arrival.transfer_id)) {
      if (auto it = timelines_.find(arrival.request_id); it != timelines_.end()) {
        it->second.timeline.kv_landed_ns = steady_now_ns() - it->second.received;
      }
      out.kv_landed.push_back(arrival);
      plan_next(out);
    }
    return out;
  }
  const sequence* seq = scheduler_.find(arrival.request_id);
  if (seq == nullptr || seq->kv().transfer_id != arrival.transfer_id) return out;  // moved on already
  scheduler_.abort(arrival.request_id);  // no delta: the request goes on elsewhere
  timelines_.erase(arrival.request_id);
  out.kv_failures.push_back(kv_failed_msg{arrival.request_id, arrival.transfer_id, arrival.why});
  plan_next(out);
  return out;
}

scheduler_stage::outputs scheduler_stage::hand_over(const kv_handover_msg& handover) {
  outputs out;
  if (auto why = scheduler_.hand_over(handover.request_id, handover.transfer_id, handover.token_ids)) {
    const sequence* seq = scheduler_.find(handover.request_id);
    if (seq != nullptr && seq->status() == sequence_status::waiting_for_kv)
      out.kv_cancels.push_back(seq->kv().transfer_id);
    scheduler_.abort(handover.request_id);
    timelines_.erase(handover.request_id);
    out.tokens.failures.push_back(request_failed{handover.request_id, error_code::internal, std::move(*why)});
  }
  plan_next(out);
  return out;
}

scheduler_stage::outputs scheduler_stage::tick(timestamp_ns now) {
  outputs out;
  if (lost_stage_since_ == 0) return out;
  const timestamp_ns wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(pipeline_failover_wait_).count();
  std::vector<int64_t> expired;
  for (const auto& [request_id, tracked] : timelines_) {
    const sequence* seq = scheduler_.find(request_id);
    // Only requests still queued: one running again is served (the stage is back), and KV on its
    // way from a prefill instance does not pass the lost stage.
    if (seq == nullptr || (seq->status() != sequence_status::waiting && seq->status() != sequence_status::preempted))
      continue;
    if (now - std::max(lost_stage_since_, tracked.received) > wait_ns) expired.push_back(request_id);
  }
  if (!expired.empty()) {
    const std::string down = stage_health_board::instance().down_text();
    const std::string why = "a pipeline stage was down for longer than failover_wait_ms (" +
                            std::to_string(pipeline_failover_wait_.count()) +
                            " ms): " + (down.empty() ? lost_stage_cause_ : down);
    spdlog::warn("scheduler: {} requests failed waiting for a lost pipeline stage: {}", expired.size(), why);
    for (int64_t request_id : expired) {
      if (!scheduler_.abort(request_id)) continue;
      timelines_.erase(request_id);
      out.tokens.failures.push_back(request_failed{request_id, error_code::unavailable, why});
    }
  }
  plan_next(out);
  return out;
}

bool scheduler_stage::holding_for_pipeline() const {
  if (lost_stage_since_ == 0) return false;
  return !in_flight_.empty() || !stage_health_board::instance().down_text().empty();
}

void scheduler_stage::plan_next(outputs& out) {
  if (holding_for_pipeline()) return;
  while (in_flight_.size() < max_in_flight_ && scheduler_.has_unfinished()) {
    // Behind a speculative step the next plan would leave out every request it verifies
    // drafts for (their token counts are unknown until it ends): wait for its result instead.
    if (!in_flight_.empty() && in_flight_.back().speculative) return;
    step_plan plan = scheduler_.schedule();
    for (kv_reservation& reservation : scheduler_.take_kv_reservations()) {
      if (auto it = timelines_.find(reservation.request_id); it != timelines_.end()) {
        it->second.timeline.kv_reserved_ns = steady_now_ns() - it->second.received;
      }
      out.kv_reservations.push_back(std::move(reservation));
    }
    if (plan.empty()) return;
    const timestamp_ns now = steady_now_ns();
    for (const auto& seq : plan.sequences) {
      auto it = timelines_.find(seq.request_id);
      if (it == timelines_.end() || it->second.scheduled) continue;
      it->second.scheduled = true;
      it->second.timeline.queue_ns = now - it->second.received;
    }
    steps_.planned(plan.step_id, now);
    in_flight_.push_back(outline_of(plan));
    out.plans.push_back(std::move(plan));
  }
}

stats_answer scheduler_stage::stats(uint64_t tag) const {
  stats_answer answer{tag,
                      scheduler_.num_free_blocks(),
                      scheduler_.kv_cache().num_blocks(),
                      scheduler_.num_running(),
                      scheduler_.num_waiting(),
                      {}};
  answer.num_waiting_for_kv = scheduler_.num_waiting_for_kv();
  answer.num_slo_rejections = scheduler_.num_slo_rejections();
  const step_time_model& model = scheduler_.step_times();
  const step_cost& fitted = model.fitted();
  step_model_report report;  // instance and role: the router's to set
  report.coefficients.assign(fitted.seconds.begin(), fitted.seconds.end());
  report.token_floor = fitted.token_floor;
  report.min_step_s = fitted.min_seconds;
  report.rms_error_s = model.rms_error();
  report.num_steps = static_cast<int64_t>(model.num_observed());
  answer.step_models.push_back(std::move(report));
  const process_cpu_time cpu = process_cpu_while_serving();
  answer.processes.push_back(process_cpu_report{process_identity(), cpu.total_s, cpu.compute_s});
  // A pipelined engine's remote stages are processes of the cluster too.
  for (const stage_process_cpu& stage : stage_load_board::instance().processes()) {
    answer.processes.push_back(process_cpu_report{stage.process, stage.total_s, stage.compute_s});
  }
  // A pipelined engine whose remote stage is lost cannot compute a step: /health says which.
  answer.unavailable = stage_health_board::instance().down_text();
  answer.pipeline_busy = stage_busy_text(stage_load_board::instance().shares(std::chrono::steady_clock::now()));
  return answer;
}

trace_answer scheduler_stage::trace(const trace_query& query) const {
  trace_answer answer;
  answer.tag = query.tag;
  answer.steps = steps_.recent(query.window_ns, steady_now_ns());
  return answer;
}

}  // namespace troupe

namespace troupe {

engine_load scheduler_stage::load() const {
  return engine_load{scheduler_.num_free_blocks(), scheduler_.kv_cache().num_blocks(), scheduler_.num_running(),
                     scheduler_.num_waiting(), scheduler_.step_times().seconds_per_prompt_token()};
}

}  // namespace troupe
