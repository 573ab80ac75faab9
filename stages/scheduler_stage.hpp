#pragma once
// The scheduler stage's work, without the actor: keeps one step in flight (two with
// async_scheduling: step N+1 is planned and sent while the worker runs step N), turns results
// into token deltas, answers aborts and stats, and keeps each request's timeline. Every call
// returns what must be sent on; the actor only delivers it.

#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "engine/scheduler.hpp"
#include "stages/messages.hpp"
#include "stages/step_log.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

class scheduler_stage {
 public:
  struct outputs {
    std::vector<step_plan> plans;   // to the worker, in this order
    // To the detokenizer (when not empty): deltas, and the requests a failed step ended, which
    // the detokenizer must forget before it tells the frontend.
    token_batch tokens;
    // To the frontend: requests never admitted, so the detokenizer never saw them (a duplicate
    // id must not make it forget the live request of that id).
    std::vector<request_failed> refusals;
    // Disaggregation: blocks reserved for KV on its way (to the KV agent, which answers with
    // where the prefill side must send it), transfers no longer expected (to the KV agent), and
    // requests dropped because their KV never came (to the router).
    std::vector<kv_reservation> kv_reservations;
    std::vector<uint64_t> kv_cancels;
    std::vector<kv_failed_msg> kv_failures;
    std::vector<kv_arrival_msg> kv_landed;  // to the router: the prefill half may go now
  };

  scheduler_stage(const engine_config& config, std::vector<int32_t> eos_token_ids);

  outputs add(schedule_request request);
  // `quietly`: the router drops this half of a disaggregated request (abort_request_msg::quietly).
  outputs abort(int64_t request_id, bool quietly = false);
  // The detokenizer matched a stop string: finish the request now so its blocks are free for
  // the next step. Its final delta goes to the detokenizer, which holds the truncated text.
  outputs stop(int64_t request_id);
  outputs step_finished(const step_done& done);
  // The KV agent's word on a reserved transfer: complete (the request runs once its first token
  // is handed over) or failed (the request leaves this instance; the router hears why).
  outputs kv_arrived(const kv_arrival_msg& arrival);
  // The prefill side's first token(s), from the router.
  outputs hand_over(const kv_handover_msg& handover);
  stats_answer stats(uint64_t tag) const;
  // The steps that started within the query's window, for a trace.
  trace_answer trace(const trace_query& query) const;
  engine_load load() const;

  bool step_in_flight() const { return !in_flight_.empty(); }
  int num_steps_in_flight() const { return static_cast<int>(in_flight_.size()); }
  const scheduler& engine_scheduler() const { return scheduler_; }

 private:
  // A request's timeline and the scheduler's own reading of when it received the request: the
  // stamp stays here, only the durations measured from it leave with the final delta.
  struct tracked_timeline {
    timestamp_ns received = 0;
    bool scheduled = false;  // queue_ns counts to the first admission, not to re-admissions
    request_timeline timeline;
  };

  void plan_next(outputs& out);
  void emit(outputs& out, token_delta delta);

  scheduler scheduler_;
  // What the steps sent to the worker need for update(), oldest first: results come back in
  // this order. An outline, not a copy of the plan, which would duplicate every sequence.
  std::deque<step_outline> in_flight_;
  size_t max_in_flight_;
  std::unordered_map<int64_t, tracked_timeline> timelines_;
  // Aborts that overtook their request (still being tokenized): applied when it arrives.
  std::unordered_set<int64_t> early_aborts_;
  std::deque<int64_t> early_abort_order_;
  // Prefill-only requests handed off lately: an abort for one (sent before the router saw the
  // hand-off) is not an early abort, which would kill the id's next run here.
  std::unordered_set<int64_t> handed_off_;
  std::deque<int64_t> handed_off_order_;

  step_log steps_;
};

}  // namespace troupe
