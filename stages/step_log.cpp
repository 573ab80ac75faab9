#include "stages/step_log.hpp"

#include <algorithm>

namespace troupe {

void step_log::planned(uint64_t step_id, timestamp_ns now) {
  pending_.push_back({step_id, now});
  // A step whose result never came (the worker was lost) must not pile up.
  while (pending_.size() > 8) pending_.pop_front();
}

duration_ns step_log::finished(const step_outline& step, timestamp_ns now, duration_ns compute_ns) {
  auto it =
      std::find_if(pending_.begin(), pending_.end(), [&](const pending_step& p) { return p.step_id == step.step_id; });
  if (it == pending_.end()) return 0;
  recorded_step r;
  // With two steps in flight the worker starts the second when it has answered the first: the
  // step runs from the later of its plan and the previous result, so steps never overlap.
  r.start = std::max(it->start, last_finished_);
  last_finished_ = now;
  pending_.erase(it);
  step_event& e = r.event;
  e.step_id = step.step_id;
  e.elapsed_ns = now - r.start;
  e.compute_ns = compute_ns;
  e.request_ids.reserve(step.sequences.size());
  for (const planned_sequence& s : step.sequences) {
    e.request_ids.push_back(s.request_id);
    // A decode chunk is the one token sampled last step; a first chunk of one token is a prompt.
    if (s.num_new_tokens == 1 && s.num_computed_tokens > 0) {
      ++e.num_decode_sequences;
      e.num_decode_tokens += 1;
    } else {
      ++e.num_prefill_sequences;
      e.num_prefill_tokens += s.num_new_tokens;
    }
  }
  const duration_ns elapsed = e.elapsed_ns;
  steps_.push_back(std::move(r));
  while (steps_.size() > capacity_) steps_.pop_front();
  return elapsed;
}

std::vector<step_event> step_log::recent(duration_ns window, timestamp_ns now) const {
  std::vector<step_event> out;
  // Steps are recorded in finishing order, which is their starting order: plans are answered in turn.
  auto first =
      std::find_if(steps_.begin(), steps_.end(), [&](const recorded_step& r) { return now - r.start <= window; });
  for (auto it = first; it != steps_.end(); ++it) {
    step_event e = it->event;
    e.age_ns = now - it->start;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace troupe
