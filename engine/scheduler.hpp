#pragma once
// The token-budget scheduler. Each step hands out at most max_num_batched_tokens tokens:
// running sequences first (a decode token, or the next chunk of a prompt), then waiting ones
// by priority and arrival, each given min(what it still needs, what is left of the budget).
// When KV blocks run out, the running sequence the policy puts last (by default the lowest-
// priority, newest) is preempted and later recomputed from its tokens (cheap when its blocks are
// still in the prefix cache). The orders, preemption by a waiting request and the cap on a step's
// prefill tokens come from the scheduling policy engine_config names (engine/scheduling_policy.hpp);
// the step-time model it predicts with is fed by observe_step.
//
// Use: schedule() -> run the plan -> update(plan, result) -> schedule() ... Plain class, not
// thread-safe: the scheduler actor owns it.
//
// Overlapped (async) use: schedule() may be called again while one plan is still out, before
// its update(). The new plan continues each sequence where the earlier plan left it: a decode's
// input is then "the token sampled in the previous step" (input_from_previous_sample), filled in
// by the model_runner. Results must be applied in plan order; at most two plans may be out.
//
// Speculative decoding: an entry that samples for a request that speculates gets draft slots
// (scheduled_sequence::num_draft_slots) counted in the token budget and covered by KV blocks;
// they are the first thing given up when blocks run short (never a reason to preempt). Its
// result carries 1 + accepted tokens; the rejected slots are rolled back (not computed; their
// blocks are kept for the tokens to come). A speculating request is never planned while a
// sample of its is pending, since how many tokens it gains is known only from the result.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine_config.hpp"
#include "engine/request_error.hpp"
#include "engine/scheduling_policy.hpp"
#include "engine/sequence.hpp"
#include "engine/step_plan.hpp"
#include "engine/step_time_model.hpp"
#include "engine/token_delta.hpp"
#include "kvcache/kv_cache_manager.hpp"

namespace troupe {

class scheduler {
 public:
  // `eos_token_ids` end a sequence unless its params say ignore_eos.
  scheduler(const engine_config& config, std::vector<int32_t> eos_token_ids);

  // Queues a request. Refuses (and keeps nothing) when the waiting queue is full (overloaded),
  // the id is live already, or the request could never run in this engine.
  //
  // `resumed_output_ids` resumes a request another engine was generating (failover): the tokens
  // it already generated and streamed. The sequence continues as if it had generated them
  // itself: they are prefilled after the prompt, count for max_tokens, penalties, the seeded
  // sampler's output index and the final metrics' output count, and deltas carry only the
  // tokens generated here. A request that could not still be running is refused as invalid:
  // resumed outputs that reach max_tokens, or hold a token that would have stopped it (eos
  // unless ignore_eos, a stop id); prompt + resumed outputs must leave room under max_model_len.
  //
  // `kv` makes it one half of a disaggregated pair (engine/kv_handoff.hpp). Role send: computed
  // as usual up to its first sampled token, which comes out in a delta marked handed_off (not a
  // final one), and then the request is forgotten here (its blocks go back to the pool; the
  // worker streamed the KV out while computing it). Role receive: admitted in queue order like
  // any request, but into waiting_for_kv: blocks for its prompt and resumed outputs are
  // reserved (take_kv_reservations lists them for the KV receiver), it takes no part in steps
  // and is never preempted, and it runs from the step after both kv_arrived and hand_over.
  std::optional<request_error> add_request(int64_t request_id, std::vector<int32_t> prompt_ids, sampling_params params,
                                           int priority = 0, engine_clock::time_point arrival = engine_clock::now(),
                                           std::span<const int32_t> resumed_output_ids = {}, kv_handoff kv = {},
                                           service_targets targets = {});

  step_plan schedule();
  // Why `result` cannot be the outcome of `step` (another step's id, a token for a request the
  // step did not sample, one missing or duplicated, out of plan order, a token id outside the
  // vocabulary, logprob lists of unequal length), or nothing when it can. Changes nothing.
  std::optional<std::string> check_result(const step_outline& step, const step_result& result) const;
  // Applies a step's outcome: advances computed tokens, appends sampled tokens, finishes and
  // frees sequences. Entries for requests aborted or preempted since the plan are ignored.
  // A result check_result refuses throws std::invalid_argument before anything changes.
  std::vector<token_delta> update(const step_outline& step, const step_result& result);
  std::vector<token_delta> update(const step_plan& plan, const step_result& result) {
    return update(outline_of(plan), result);
  }
  // Ends a request now and frees its blocks; its final delta, or nothing for an unknown id.
  std::optional<token_delta> abort(int64_t request_id);
  // Ends a request whose text matched one of its stop strings (only the detokenizer sees text)
  // and frees its blocks; its final delta (finish stop, no new tokens), or nothing for an id that
  // is no longer live. Tokens that steps in flight sample for it are dropped, like an abort's.
  std::optional<token_delta> stop(int64_t request_id);

  // Reservations made since the last call (role receive requests admitted into waiting_for_kv).
  std::vector<kv_reservation> take_kv_reservations() { return std::exchange(new_kv_reservations_, {}); }
  // The KV of a waiting_for_kv request is complete in its blocks. False for an unknown request or
  // another transfer (a late report of an earlier attempt): nothing changes.
  bool kv_arrived(int64_t request_id, uint64_t transfer_id);
  // The prefill side's output tokens for a waiting_for_kv request (its first sampled token):
  // they follow the prompt and resumed outputs as outputs. Returns why they cannot be (a token
  // outside the vocabulary, or one that would have ended the request there), or nothing when they
  // are taken or the request or transfer is unknown (ignored). A refused hand-over changes nothing.
  std::optional<std::string> hand_over(int64_t request_id, uint64_t transfer_id, std::span<const int32_t> token_ids);

  // The clock that stamps arrivals' queueing, tokens and finishes, and that the policies' deadlines
  // are judged on: the steady clock unless set. `troupe plan` runs this very scheduler on a
  // simulated clock (planner/cluster_simulation.hpp), so what it predicts is this code's behaviour.
  using clock_function = std::function<engine_clock::time_point()>;
  void set_clock(clock_function clock) { clock_ = std::move(clock); }

  // A step this scheduler planned took `seconds` on the worker: evidence for the step-time model.
  void observe_step(const step_outline& step, double seconds) { step_times_->observe(shape_of(step), seconds); }
  const step_time_model& step_times() const { return *step_times_; }
  // Requests refused at once because their TTFT target could not be met (slo_admission reject).
  int64_t num_slo_rejections() const { return num_slo_rejections_; }

  bool has_unfinished() const { return !sequences_.empty(); }
  int num_waiting_for_kv() const { return static_cast<int>(waiting_for_kv_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_free_blocks() const { return kv_.num_free_blocks(); }
  const kv_cache_manager& kv_cache() const { return kv_; }
  // After a failed step: no later request may hit a prefix whose KV that step may have spoiled.
  int forget_cached_prefixes() { return kv_.forget_cached_prefixes(); }
  // The model lost the KV of every running sequence (a pipeline stage restarted): each goes back
  // to waiting as a preempted one, to be recomputed from its tokens, prompt and outputs so far,
  // when admitted again. Its outputs stay outputs (counts, penalties, the sampler's output index),
  // so its deltas go on from the next new token. The next plan tells the worker. Returns how many.
  int recompute_all_running();
  const engine_config& config() const { return config_; }
  // The live request with this id, or nullptr.
  const sequence* find(int64_t request_id) const;

 private:
  std::optional<request_error> check_request(int64_t request_id, int num_prompt_tokens, const sampling_params& params,
                                             std::span<const int32_t> resumed_output_ids) const;
  // Why `resumed_output_ids` cannot be the outputs of a request still running, or nothing.
  std::optional<std::string> check_resumed_outputs(std::span<const int32_t> resumed_output_ids,
                                                   const sampling_params& params) const;
  engine_clock::time_point clock_now() const { return clock_ ? clock_() : engine_clock::now(); }
  scheduled_sequence plan_entry(const sequence& seq, int num_new_tokens, int num_draft_slots) const;
  // Speculative decoding: the drafts a request asks for per step (its own choice, or the
  // engine's default; capped by max_speculative_tokens); 0 when it does not speculate here.
  int requested_drafts(const sequence& seq) const;
  // Draft slots for an entry of `num_new_tokens` from token `first_new_token` on (0 unless it
  // samples), within what is left of the budget, max_tokens and max_model_len.
  int draft_slots(const sequence& seq, int first_new_token, int num_new_tokens, int budget_left) const;
  // How many of `result`'s tokens from `next` on belong to `entry` (in `count`), or why they cannot.
  std::optional<std::string> entry_token_count(const step_outline& step, const planned_sequence& entry,
                                               const step_result& result, size_t next, size_t& count) const;
  // Sliding-window models (config_.kv_window > 0): gives back the sequence's blocks that no query
  // to come attends to.
  void release_behind_window(sequence& seq);
  // Keeps a prefix hit's first max_blocks blocks.
  void trim_hit(prefix_hit& hit, int max_blocks) const;
  bool ends_with_pending_sample(const sequence& seq) const;
  // Whether the sequence's next entry is a decode (one token on a computed history), not a
  // prompt chunk: the slo policy's prefill cap spares decodes.
  static bool is_decoding(const sequence& seq);
  // A role receive sequence whose KV and handed-off tokens are both here starts running.
  void start_if_ready(sequence& seq);
  // Takes a sequence out of the queue its status `queued_as` names (running, waiting_for_kv or
  // waiting), frees its blocks and forgets it, telling the worker (which knew it).
  void release(sequence& seq, sequence_status queued_as);
  void insert_running(sequence* seq);
  void remove_running(sequence* seq);
  void preempt(sequence* seq, step_plan& plan);
  // Takes a running sequence's blocks and puts it back to waiting, to be recomputed.
  void requeue_for_recompute(sequence* seq);
  // Preempts running sequences the next waiting request may displace (the policy says which),
  // until it could be admitted: blocks for its prompt and a seat.
  void preempt_for_waiting_head(step_plan& plan);
  void erase_waiting(sequence* seq);
  // What a sequence's status is once `token_id` is appended, given its counts after the append.
  sequence_status stop_status(const sampling_params& params, int32_t token_id, int num_output_tokens,
                              int num_tokens) const;
  sequence_status stop_status(const sequence& seq, int32_t token_id) const;
  token_delta finish(sequence& seq, sequence_status status, engine_clock::time_point now);

  engine_config config_;
  clock_function clock_;  // empty: engine_clock::now
  std::vector<int32_t> eos_token_ids_;
  kv_cache_manager kv_;
  std::unordered_map<int64_t, std::unique_ptr<sequence>> sequences_;  // every live request
  // Behind a pointer, so the policy's reference survives a move of the scheduler.
  std::unique_ptr<step_time_model> step_times_ = std::make_unique<step_time_model>();
  std::unique_ptr<scheduling_policy> policy_;
  std::vector<sequence*> waiting_;         // the policy picks from it
  std::vector<sequence*> running_;         // in the policy's running order: the back is preempted first
  std::vector<sequence*> waiting_for_kv_;  // role receive, blocks reserved, KV arriving
  std::vector<kv_reservation> new_kv_reservations_;
  uint64_t next_arrival_order_ = 0;
  int64_t num_slo_rejections_ = 0;
  uint64_t next_step_id_ = 0;
  // Requests the worker knows that ended since the last non-empty plan (which carries them).
  std::vector<int64_t> finished_since_plan_;
  // Requests preempted outside schedule() (recompute_all_running) since the last non-empty plan.
  std::vector<int64_t> preempted_since_plan_;
};

}  // namespace troupe
