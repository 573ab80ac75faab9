#include "stages/instance_fan_in.hpp"

#include <algorithm>

namespace troupe {

stats_fan_in::stats_fan_in(uint64_t tag, int num_instances) : num_pending_(num_instances) { sum_.tag = tag; }

void stats_fan_in::add(const stats_answer& answer) {
  sum_.num_free_blocks += answer.num_free_blocks;
  sum_.num_total_blocks += answer.num_total_blocks;
  sum_.num_running += answer.num_running;
  sum_.num_waiting += answer.num_waiting;
  sum_.num_waiting_for_kv += answer.num_waiting_for_kv;
  sum_.num_kv_leases += answer.num_kv_leases;
  sum_.num_slo_rejections += answer.num_slo_rejections;
  sum_.step_models.insert(sum_.step_models.end(), answer.step_models.begin(), answer.step_models.end());
  for (const process_cpu_report& p : answer.processes) {
    const bool known = std::any_of(sum_.processes.begin(), sum_.processes.end(),
                                   [&](const process_cpu_report& q) { return q.process == p.process; });
    if (!known) sum_.processes.push_back(p);
  }
  if (answer.unavailable.empty()) {
    ++num_serving_;
  } else {
    down_ += (down_.empty() ? "" : "; ") + answer.unavailable;
  }
  ++num_answered_;
  --num_pending_;
}

void stats_fan_in::fail(std::string error) {
  last_error_ = std::move(error);
  --num_pending_;
}

stats_answer stats_fan_in::reply() {
  if (num_answered_ == 0) {
    sum_.unavailable = "no engine instance answered: " + last_error_;
  } else if (num_serving_ == 0) {
    sum_.unavailable = "no engine instance can serve: " + down_;  // e.g. a pipeline stage down
  }
  return std::move(sum_);
}

trace_fan_in::trace_fan_in(uint64_t tag, int num_instances) : num_pending_(num_instances) { all_.tag = tag; }

void trace_fan_in::add(int32_t instance, std::string node, trace_answer answer, timestamp_ns sent,
                       timestamp_ns received) {
  const duration_ns half_round_trip = (received - sent + 1) / 2;
  const timestamp_ns answered = sent + (received - sent) / 2;
  for (step_event& step : answer.steps) {
    step.instance = instance;
    steps_.emplace_back(answered - step.age_ns, std::move(step));
  }
  all_.instances.push_back(trace_instance{instance, std::move(node), half_round_trip});
  --num_pending_;
}

void trace_fan_in::fail(std::string error) {
  last_error_ = std::move(error);
  --num_pending_;
}

trace_answer trace_fan_in::reply(timestamp_ns now) {
  if (all_.instances.empty()) all_.unavailable = "no engine instance answered: " + last_error_;
  for (auto& [start, step] : steps_) {
    step.age_ns = now - start;
    all_.steps.push_back(std::move(step));
  }
  steps_.clear();
  return std::move(all_);
}

}  // namespace troupe
