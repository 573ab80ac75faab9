#pragma once
// What the scheduler asks a worker to run in one step, and what comes back. Plain data only
// (ints, floats, vectors; no pointers) so the plan and the result can cross actor and process
// boundaries as they are.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/token_delta.hpp"
#include "protocol/sampling_params.hpp"

namespace troupe {

// One sequence's share of a step: its next tokens, computed on top of what its KV cache holds.
struct scheduled_sequence {
  int64_t request_id = 0;
  int32_t num_computed_tokens = 0;     // tokens already in the KV cache: new positions start here
  std::vector<int32_t> new_token_ids;  // [num_new_tokens] tokens whose K/V this step computes
  // Overlapped scheduling: the last of new_token_ids (a -1 placeholder here) is the token this
  // request sampled in the step just before this one, which the worker fills in from its own
  // results (and already holds in its penalty history).
  bool input_from_previous_sample = false;
  // The block ids covering num_computed + num_new tokens, from index block_table_start on: the
  // worker keeps each request's table and appends these (a decode step mostly sends none). A
  // start of 0 (a request new to the worker, or back after preemption) replaces the table.
  int32_t block_table_start = 0;
  std::vector<int32_t> block_table;
  // True when the chunk reaches the sequence's last known token: its logits are sampled.
  bool sample = false;
  int32_t output_index = 0;  // index of the token being sampled among the outputs (seeded RNG)
  // The request's sampling parameters, on the entry that starts its state on the worker
  // (block_table_start 0: new to the worker, or back after preemption) and on no other: the
  // worker keeps them with the block table, so a decode step does not carry them again.
  std::optional<sampling_params> params;
  // Only on the entry that carries `params`, when they use penalties or structured output (the
  // worker's grammar matcher replays the outputs): the prompt followed by
  // every token generated so far, of which the first num_prompt_tokens are the prompt. The worker
  // keeps this history and appends each token it samples for the request, so later entries do
  // not resend it (a sample the scheduler later drops ends or preempts the request, which
  // drops the worker's history with it).
  std::vector<int32_t> penalty_token_ids;
  int32_t num_prompt_tokens = 0;
  // Only on the entry that carries `params`, for a prefill-only request (kv_role::send): the
  // transfer its KV streams out under, layer by layer while the steps compute it.
  uint64_t kv_send_transfer_id = 0;
  // Speculative decoding, on an entry that samples: the worker may append up to this many draft
  // tokens after new_token_ids (the block table covers them, the token budget counted them),
  // verify them in this forward and return 1 + the number it accepted (step_result). Slots of
  // rejected drafts are rolled back: the scheduler counts only accepted tokens as computed.
  int32_t num_draft_slots = 0;
  // Only on the entry that carries `params`: the request may speculate, so penalty_token_ids
  // carries its history (the worker's n-gram proposer and draft model read it).
  bool speculative = false;

  int num_new_tokens() const { return static_cast<int>(new_token_ids.size()); }
};

struct step_plan {
  uint64_t step_id = 0;
  std::vector<scheduled_sequence> sequences;
  // Requests that lost their blocks in this step (their KV is gone; they will be recomputed).
  std::vector<int64_t> preempted_ids;
  // Requests that ended since the previous plan: the worker drops the block tables it keeps for
  // them before it applies this plan's entries (an id may be reused by a new request).
  std::vector<int64_t> finished_ids;

  bool empty() const { return sequences.empty(); }
  int num_tokens() const {
    int n = 0;
    for (const auto& s : sequences) n += s.num_new_tokens();
    return n;
  }
};

// What applying a step's result needs of its plan (scheduler::update): whoever sends a plan keeps
// this instead of a copy, which would duplicate every sequence's tokens, block table and params.
struct planned_sequence {
  int64_t request_id = 0;
  int32_t num_computed_tokens = 0;
  int32_t num_new_tokens = 0;
  bool sample = false;
  int32_t num_draft_slots = 0;
};

struct step_outline {
  uint64_t step_id = 0;
  std::vector<planned_sequence> sequences;  // in the plan's order
  // Some entry has draft slots: how many tokens it yields is known only from its result, so
  // the next plan waits for it (no overlapped planning behind a speculative step).
  bool speculative = false;
};

inline step_outline outline_of(const step_plan& plan) {
  step_outline outline;
  outline.step_id = plan.step_id;
  outline.sequences.reserve(plan.sequences.size());
  for (const scheduled_sequence& s : plan.sequences) {
    outline.sequences.push_back({s.request_id, s.num_computed_tokens, s.num_new_tokens(), s.sample, s.num_draft_slots});
    outline.speculative = outline.speculative || s.num_draft_slots > 0;
  }
  return outline;
}

struct sampled_token {
  int64_t request_id = 0;
  int32_t token_id = 0;
  // Filled when the request asked for logprobs (of the model's raw distribution).
  float logprob = 0.0f;
  std::vector<int32_t> top_token_ids;  // [top_n] most likely tokens, most likely first
  std::vector<float> top_logprobs;     // [top_n]
  // On the first token of an entry with draft slots: how many drafts the worker proposed and
  // verified for it (0 when it found none). 0 on every other token.
  int32_t num_drafts = 0;
  // A pooling request's embedding ([hidden_size]), on the token sampled after its prompt.
  std::vector<float> embedding;
  // A request that asked for prompt_logprobs: on the token sampled after its prompt (output 0),
  // every prompt position's (the worker gathers them over the prompt's chunks).
  std::vector<prompt_token_logprob> prompt_logprobs;  // [num_prompt_tokens - 1]
};

// A request the worker could not serve this step (a logits plugin failed on its row): the
// scheduler ends it with `why`; its sampled token, still in `tokens`, is dropped.
struct failed_request {
  int64_t request_id = 0;
  std::string why;
};

struct step_result {
  uint64_t step_id = 0;
  // One per scheduled sequence with `sample` set, in the plan's order; an entry with draft
  // slots has 1 + (drafts accepted) consecutive tokens: the accepted drafts, then the token the
  // target model chose where it disagreed (or after the last draft).
  std::vector<sampled_token> tokens;
  std::vector<failed_request> failed;
};

}  // namespace troupe
