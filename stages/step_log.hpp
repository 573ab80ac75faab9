#pragma once
// A scheduler's recent steps, for traces: a bounded ring of step events (the oldest is dropped
// when it is full), recorded as steps are planned and finished, read by a trace query. Plain
// class, used by the scheduler stage's one thread; recording is two stamps and a small copy per
// step, nothing per token.

#include <cstddef>
#include <deque>
#include <vector>

#include "engine/step_plan.hpp"
#include "stages/stage_clock.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

class step_log {
 public:
  static constexpr size_t default_capacity = 4096;

  explicit step_log(size_t capacity = default_capacity) : capacity_(capacity) {}

  // The plan of step `step_id` went to the worker at `now`. A step is timed from then, or from
  // the previous step's result when that came later (async scheduling sends the next plan while
  // the worker still runs the last one, which it answers first).
  void planned(uint64_t step_id, timestamp_ns now);
  // Its result came back at `now` (a step never planned here is ignored). Returns how long the
  // step held the engine, from its start as above to now; 0 for a step never planned here.
  duration_ns finished(const step_outline& step, timestamp_ns now, duration_ns compute_ns);

  // The steps that started within `window` before `now`, oldest first, with their start as an
  // age before `now`.
  std::vector<step_event> recent(duration_ns window, timestamp_ns now) const;
  size_t size() const { return steps_.size(); }

 private:
  struct recorded_step {
    timestamp_ns start = 0;
    step_event event;  // age_ns left 0: computed when read
  };
  struct pending_step {
    uint64_t step_id = 0;
    timestamp_ns start = 0;
  };

  size_t capacity_;
  std::deque<pending_step> pending_;  // planned, not yet finished: at most two (async scheduling)
  std::deque<recorded_step> steps_;
  timestamp_ns last_finished_ = 0;
};

}  // namespace troupe
