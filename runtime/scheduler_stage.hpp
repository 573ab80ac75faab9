#pragma once
// The scheduler stage's work, without the actor: keeps one step in flight, turns results into
// token deltas, answers aborts and stats, and keeps each request's timeline. Every call returns
// what must be sent on; the actor only delivers it.

#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "engine/scheduler.hpp"
#include "runtime/messages.hpp"

namespace troupe {

class scheduler_stage {
 public:
  struct outputs {
    std::optional<step_plan> plan;  // to the worker
    token_batch tokens;             // to the detokenizer (when not empty)
    std::vector<request_failed> failures;  // to the frontend
  };

  scheduler_stage(const engine_config& config, std::vector<int32_t> eos_token_ids);

  outputs add(schedule_request request);
  outputs abort(int64_t request_id);
  // The detokenizer matched a stop string: finish the request now so its blocks are free for
  // the next step. Its final delta goes to the detokenizer, which holds the truncated text.
  outputs stop(int64_t request_id);
  outputs step_finished(const step_done& done);
  stats_answer stats(uint64_t tag) const;

  bool step_in_flight() const { return in_flight_.has_value(); }
  const scheduler& engine_scheduler() const { return scheduler_; }

 private:
  void plan_next(outputs& out);
  void emit(outputs& out, token_delta delta);

  scheduler scheduler_;
  std::optional<step_plan> in_flight_;
  std::unordered_map<int64_t, request_timeline> timelines_;
  // Aborts that overtook their request (still being tokenized): applied when it arrives.
  std::unordered_set<int64_t> early_aborts_;
  std::deque<int64_t> early_abort_order_;
};

}  // namespace troupe
