#pragma once
// The scheduler stage's work, without the actor: keeps one step in flight (two with
// async_scheduling: step N+1 is planned and sent while the worker runs step N), turns results
// into token deltas, answers aborts and stats, and keeps each request's timeline. Every call
// returns what must be sent on; the actor only delivers it.

#include <chrono>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "engine/scheduler.hpp"
#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"
#include "stages/step_log.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

class scheduler_stage {
 public:
  struct outputs {
    std::vector<step_plan> plans;  // to the worker, in this order
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

  // `pipeline_failover_wait`: how long requests wait for a lost pipeline stage (below).
  scheduler_stage(const engine_config& config, std::vector<int32_t> eos_token_ids,
                  std::chrono::milliseconds pipeline_failover_wait = std::chrono::milliseconds(30000));

  outputs add(schedule_request request);
  // `quietly`: the router drops this half of a disaggregated request (abort_request_msg::quietly).
  outputs abort(int64_t request_id, bool quietly = false);
  // The detokenizer matched a stop string: finish the request now so its blocks are free for
  // the next step. Its final delta goes to the detokenizer, which holds the truncated text.
  outputs stop(int64_t request_id);
  // A step that failed because a pipeline stage was lost (step_done::stage_lost) ends none of
  // its requests: every running request gives up its KV and waits to be recomputed from its
  // tokens (scheduler::recompute_all_running), and no step is planned while the stage is down
  // (the process's stage_health_board) or a step from before is still out. Any other failed step
  // ends its requests with the reason.
  outputs step_finished(const step_done& done);
  // While waiting for a lost stage (waiting_for_pipeline), called every so often with the time:
  // requests that have waited longer than the failover wait (from the loss, or from their
  // arrival when later) fail naming the stage; once the stage is back the next step is planned.
  outputs tick(timestamp_ns now);
  // Requests wait for a lost pipeline stage: the caller should tick() until this is false.
  bool waiting_for_pipeline() const { return lost_stage_since_ != 0 && scheduler_.has_unfinished(); }
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
    uint32_t attempt = 0;  // the router's run of the request, stamped on its deltas
  };

  void plan_next(outputs& out);
  // No step may be planned: a stage is lost and not back yet, or a step planned before the loss
  // is still out (its requests were put back; it comes back failed or stale).
  bool holding_for_pipeline() const;
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
  // Since when (steady_now_ns) a lost pipeline stage holds the requests; 0: none is. Ends with
  // the first step that succeeds. `lost_stage_cause_`: that first failed step's error, which names
  // the stage, for requests that time out when the health board no longer says why.
  std::chrono::milliseconds pipeline_failover_wait_;
  timestamp_ns lost_stage_since_ = 0;
  std::string lost_stage_cause_;
};

}  // namespace troupe
