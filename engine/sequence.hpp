#pragma once
// Everything the engine knows about one request: its tokens, how many of them the KV cache
// holds, its blocks, its sampling parameters and its timeline. Its state changes only through
// the named transitions below (admit, planned, sample_returned, preempt, ...), each of which
// checks before it changes: a sequence is never left half-changed.

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv_handoff.hpp"
#include "engine/request_status.hpp"
#include "engine/step_plan.hpp"
#include "engine/token_delta.hpp"
#include "kvcache/block_table.hpp"
#include "protocol/sampling_params.hpp"
#include "protocol/service_targets.hpp"

namespace troupe {

using engine_clock = std::chrono::steady_clock;

struct sequence_timeline {
  engine_clock::time_point arrival;
  engine_clock::time_point first_scheduled;  // first admission (not re-admissions)
  engine_clock::time_point first_token;
  engine_clock::time_point finish;
  // The latest output token's arrival: with first_token it is all tpot needs, so a request does
  // not keep (or reserve) a time per token.
  engine_clock::time_point last_token;
  bool scheduled = false;
};

class sequence {
 public:
  // `resumed_output_ids`: outputs the request already generated elsewhere (a failed-over request,
  // see scheduler::add_request). They follow the prompt as outputs, never as prompt: they count
  // for max_tokens, penalties and the seeded sampler's output index, and no delta repeats them.
  sequence(int64_t request_id, std::vector<int32_t> prompt_ids, sampling_params params, int priority,
           uint64_t arrival_order, engine_clock::time_point arrival = engine_clock::now(),
           std::span<const int32_t> resumed_output_ids = {}, kv_handoff kv = {}, service_targets targets = {});

  int64_t request_id() const { return request_id_; }
  // Its part in a disaggregated pair (engine/kv_handoff.hpp); role none for an ordinary request.
  const kv_handoff& kv() const { return kv_; }
  const sampling_params& params() const { return params_; }
  // Lower runs first; equal priorities run in arrival order.
  int priority() const { return priority_; }
  uint64_t arrival_order() const { return arrival_order_; }

  // The prompt followed by every generated token.
  std::span<const int32_t> token_ids() const { return token_ids_; }
  int num_tokens() const { return static_cast<int>(token_ids_.size()); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }
  // Outputs generated before this engine took the request over (0 for a fresh request).
  int num_resumed_output_tokens() const { return num_resumed_output_tokens_; }
  // Tokens whose K/V is computed or being computed by a step in flight.
  int num_scheduled_tokens() const { return num_computed_tokens_ + num_inflight_tokens_; }
  // Known tokens plus the ones steps in flight are sampling (not yet known to the scheduler).
  int num_expected_tokens() const { return num_tokens() + num_pending_samples_; }
  // What the next step may still compute: known or pending tokens not yet scheduled.
  int num_unscheduled_tokens() const { return num_expected_tokens() - num_scheduled_tokens(); }

  // Its tenant and latency targets (the fair and slo policies read them).
  const service_targets& targets() const { return targets_; }
  sequence_status status() const { return status_; }
  const sequence_timeline& timeline() const { return timeline_; }
  request_metrics metrics() const;

  // The scheduler's counts. Computed: tokens whose K/V is in the pool; in flight: tokens handed to
  // steps still out (overlapped scheduling), and the samples those steps will return.
  int num_computed_tokens() const { return num_computed_tokens_; }
  int num_inflight_tokens() const { return num_inflight_tokens_; }
  int num_pending_samples() const { return num_pending_samples_; }
  // The step that (re)admitted the sequence: results of older steps are stale.
  uint64_t admitted_step() const { return admitted_step_; }
  // How many of blocks() the worker holds (plans send only the rest; 0 after preemption), and
  // whether a plan ever named the sequence (the worker must then hear that it ended).
  int num_blocks_on_worker() const { return num_blocks_on_worker_; }
  bool known_to_worker() const { return known_to_worker_; }
  // Role receive, while waiting_for_kv: the tokens whose KV is arriving (fixed at reservation),
  // the prefill side's tokens handed over, whether all of the KV has arrived, and whether the
  // hand-over came.
  int num_kv_tokens() const { return num_kv_tokens_; }
  int num_handed_over_tokens() const { return num_handed_over_tokens_; }
  bool kv_arrived() const { return kv_arrived_; }
  bool handed_off() const { return handed_off_; }

  // Its KV blocks. The table is the KV cache manager's to change (allocate, append, release,
  // free); the sequence only keeps it.
  block_table& blocks() { return blocks_; }
  const block_table& blocks() const { return blocks_; }
  // Chained hashes of the leading full blocks of token_ids(), filled by prefix-cache lookups so a
  // waiting request that cannot be admitted yet is not rehashed every step. Tokens are only ever
  // appended, so a full block's hash never goes stale.
  std::vector<block_hash>& block_hashes() { return block_hashes_; }
  const std::vector<block_hash>& block_hashes() const { return block_hashes_; }

  // The transitions, each the scheduler's. Each checks that it may happen before it changes
  // anything and throws std::logic_error when it may not (a scheduler bug, never a client's).

  // Waiting (or preempted) -> running: admitted with `num_cached_tokens` of its tokens already in
  // the blocks the cache manager gave it (a prefix hit), by the plan of step `step_id`.
  void admit(int num_cached_tokens, uint64_t step_id, engine_clock::time_point now);
  // Waiting -> waiting_for_kv (role receive): blocks for `num_kv_tokens` tokens are reserved for
  // the KV the prefill side streams.
  void reserve_kv(int num_kv_tokens, engine_clock::time_point now);
  // Running: a plan carries `entry` for it (its new tokens, the block table's tail, a sample).
  void planned(const scheduled_sequence& entry);
  // Running: a planned entry of `num_new_tokens` that samples nothing came back computed.
  void chunk_computed(int num_new_tokens);
  // Running: a planned entry of `num_new_tokens` that sampled came back: `num_drafts` drafts were
  // verified, `num_verified` tokens came back for it (the target's and the accepted drafts'), and
  // `outputs` (the first of them, up to the one that ends it) become outputs.
  void sample_returned(int num_new_tokens, int num_drafts, int num_verified, std::span<const sampled_token> outputs,
                       engine_clock::time_point now);
  // Role receive, waiting_for_kv: the KV of the reservation is complete in its blocks.
  void kv_complete();
  // Role receive, once: the prefill side's output tokens, after the prompt and resumed outputs.
  void hand_over(std::span<const int32_t> token_ids, engine_clock::time_point now);
  // Role receive, waiting_for_kv, once both kv_complete and hand_over happened -> running from
  // step `step_id` on, its reserved tokens computed.
  bool ready_to_start() const { return kv_arrived_ && handed_off_; }
  void start_from_kv(uint64_t step_id);
  // Running -> preempted: gives up its KV (the caller frees the blocks); it will be recomputed
  // from its first token when admitted again.
  void preempt();
  // Any -> finished_*: the sequence stops growing; the reason is kept.
  void finish(sequence_status status, engine_clock::time_point now);

 private:
  void append_token(int32_t token_id, engine_clock::time_point now);
  // Throws std::logic_error naming the transition when `holds` is false.
  void require(bool holds, const char* transition, const char* condition) const;

  int64_t request_id_;
  std::vector<int32_t> token_ids_;
  int num_prompt_tokens_;
  int num_resumed_output_tokens_;
  sampling_params params_;
  kv_handoff kv_;
  int priority_;
  uint64_t arrival_order_;
  service_targets targets_;
  sequence_status status_ = sequence_status::waiting;
  sequence_timeline timeline_;
  int num_computed_tokens_ = 0;
  int num_cached_tokens_ = 0;  // served by the prefix cache at first admission
  int num_preemptions_ = 0;
  // Speculative decoding's counts (request_metrics has their meaning).
  int num_draft_tokens_ = 0;
  int num_accepted_tokens_ = 0;
  int num_sampling_steps_ = 0;
  int num_inflight_tokens_ = 0;
  int num_pending_samples_ = 0;
  uint64_t admitted_step_ = 0;
  block_table blocks_;
  std::vector<block_hash> block_hashes_;
  int num_blocks_on_worker_ = 0;
  bool known_to_worker_ = false;
  int num_kv_tokens_ = 0;
  int num_handed_over_tokens_ = 0;
  bool kv_arrived_ = false;
  bool handed_off_ = false;
};

}  // namespace troupe
