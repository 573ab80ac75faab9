#pragma once
// How a scheduler orders its queues: which waiting request is admitted next, in which order
// running sequences get the step's budget (the last one is preempted first when KV blocks run
// short), whether a waiting request may take a running one's place, and how many prefill tokens
// a step may carry. The scheduler asks; the policy never changes the scheduler's state.
//
//   fcfs      arrival order everywhere; the newest running sequence is preempted first
//   priority  priority, then arrival (the default); a higher-priority request that cannot be
//             admitted (no blocks or no seat) preempts the lowest-priority running one
//   slo       highest response ratio next, earliest deadline first for requests about to miss
//             their TTFT target, prefill chunks capped so running decodes keep their TPOT
//             target (engine/slo_policy.hpp)
//   fair      token-weighted fair queuing across tenants (engine/fair_policy.hpp)
//
// Plain classes, one per file, built by make_scheduling_policy from engine_config.

#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_config.hpp"
#include "engine/sequence.hpp"
#include "engine/step_time_model.hpp"

namespace troupe {

class scheduling_policy {
 public:
  virtual ~scheduling_policy() = default;

  // Called once at the start of each schedule(): the time the step's decisions are made at.
  virtual void begin_step(engine_clock::time_point now) { now_ = now; }
  // Running order: `a` gets the step's budget before `b`, and is preempted after it.
  virtual bool runs_before(const sequence& a, const sequence& b) const = 0;
  // Of the waiting requests, the one to admit next (never called on an empty queue).
  virtual sequence* next_waiting(const std::vector<sequence*>& waiting) const = 0;
  // Whether `head`, the next waiting request, which cannot be admitted for want of KV blocks or a
  // seat, may preempt `victim`, the running sequence preempted first.
  virtual bool preempts(const sequence& /*head*/, const sequence& /*victim*/) const { return false; }
  // The most prefill tokens (prompt chunks) a step may carry besides `decodes`, the decodes it
  // carries; `tightest_tpot_s` is the smallest TPOT target among them (0: none has one).
  virtual int prefill_token_cap(const step_shape& /*decodes*/, double /*tightest_tpot_s*/) const { return INT_MAX; }
  // A step computes `num_tokens` tokens of `seq`.
  virtual void charge(const sequence& /*seq*/, int /*num_tokens*/) {}
  // `seq` joined the waiting queue for the first time.
  virtual void arrived(const sequence& /*seq*/) {}
  // Why `seq`, about to be queued behind `waiting` and `running`, should be refused at once
  // (overloaded), or nothing to queue it. Only the slo policy refuses, and only when asked to.
  virtual std::optional<std::string> refusal(const sequence& /*seq*/, const std::vector<sequence*>& /*waiting*/,
                                             const std::vector<sequence*>& /*running*/,
                                             engine_clock::time_point /*now*/) const {
    return {};
  }
  // `seq` ended (finished, aborted or handed off) and leaves the scheduler.
  virtual void left(const sequence& /*seq*/) {}

 protected:
  engine_clock::time_point now_{};
};

// The policy engine_config::scheduling_policy names. The SLO
// policy reads `step_times`, which must outlive it.
std::unique_ptr<scheduling_policy> make_scheduling_policy(const engine_config& config,
                                                          const step_time_model& step_times);

}  // namespace troupe
