#pragma once
// Everything the engine knows about one request: its tokens, how many of them the KV cache
// holds, its blocks, its sampling parameters and its timeline.

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv_handoff.hpp"
#include "engine/request_status.hpp"
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
           std::span<const int32_t> resumed_output_ids = {}, kv_handoff kv = {});

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
  int num_scheduled_tokens() const { return num_computed_tokens + num_inflight_tokens; }
  // Known tokens plus the ones steps in flight are sampling (not yet known to the scheduler).
  int num_expected_tokens() const { return num_tokens() + num_pending_samples; }
  // What the next step may still compute: known or pending tokens not yet scheduled.
  int num_unscheduled_tokens() const { return num_expected_tokens() - num_scheduled_tokens(); }

  void append_token(int32_t token_id, engine_clock::time_point now);
  // True once the sequence may stop growing: status becomes finished_* and the reason is kept.
  void finish(sequence_status status, engine_clock::time_point now);
  // Gives up its KV: it will be recomputed from its first token when readmitted.
  void reset_for_recompute();

  request_metrics metrics() const;

  // State the scheduler owns.
  sequence_status status = sequence_status::waiting;
  int num_computed_tokens = 0;
  int num_cached_tokens = 0;  // served by the prefix cache at first admission
  int num_preemptions = 0;
  // Speculative decoding's counts (request_metrics has their meaning).
  int num_draft_tokens = 0;
  int num_accepted_tokens = 0;
  int num_sampling_steps = 0;
  // Overlapped scheduling: tokens handed to steps still in flight, the samples those steps will
  // return, and the step that (re)admitted the sequence: results of older steps are stale.
  int num_inflight_tokens = 0;
  int num_pending_samples = 0;
  uint64_t admitted_step = 0;
  block_table blocks;
  // How many of `blocks` the worker holds (plans send only the rest; 0 after preemption), and
  // whether a plan ever named the sequence (the worker must then hear that it ended).
  int num_blocks_on_worker = 0;
  bool known_to_worker = false;
  // Chained hashes of the leading full blocks of token_ids(), filled by prefix-cache lookups so a
  // waiting request that cannot be admitted yet is not rehashed every step. Tokens are only ever
  // appended, so a full block's hash never goes stale.
  std::vector<block_hash> block_hashes;
  sequence_timeline timeline;
  // Its tenant and latency targets (the fair and slo policies read them).
  service_targets targets;
  // Role receive, while waiting_for_kv: the tokens whose KV is arriving (fixed at reservation),
  // whether all of it has, and whether the prefill side's first token(s) came (handed_off).
  int num_kv_tokens = 0;
  int num_handed_over_tokens = 0;
  bool kv_arrived = false;
  bool handed_off = false;

 private:
  int64_t request_id_;
  std::vector<int32_t> token_ids_;
  int num_prompt_tokens_;
  int num_resumed_output_tokens_;
  sampling_params params_;
  kv_handoff kv_;
  int priority_;
  uint64_t arrival_order_;
};

}  // namespace troupe
