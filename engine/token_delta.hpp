#pragma once
// What a step produced for one request: new tokens and, at the end, why and how fast.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request_status.hpp"

namespace troupe {

struct token_logprobs {
  float logprob = 0.0f;                // of the sampled token
  std::vector<int32_t> top_token_ids;  // [top_n]
  std::vector<float> top_logprobs;     // [top_n]
};

// One prompt token's logprob (sampling_params::prompt_logprobs): under the model's raw
// distribution given the prompt tokens before it. A prompt of n tokens has n - 1 of these, for its
// tokens 1 .. n - 1 (the first has nothing before it).
struct prompt_token_logprob {
  int32_t token_id = 0;  // the prompt's token at this position
  float logprob = 0.0f;
  int32_t rank = 0;                    // 1 + the number of tokens the model found more likely
  std::vector<int32_t> top_token_ids;  // [top_n] most likely tokens, most likely first
  std::vector<float> top_logprobs;     // [top_n]
};

// Seconds, from the request's own timeline.
struct request_metrics {
  double queue_time = 0.0;  // arrival -> first scheduled
  double ttft = 0.0;        // arrival -> first token
  double tpot = 0.0;        // mean time between output tokens after the first (0 with one token)
  double e2e = 0.0;         // arrival -> finish
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;  // a resumed request's earlier outputs included (usage as undisturbed)
  int num_cached_tokens = 0;  // prompt tokens served from the prefix cache at first admission
  int num_preemptions = 0;
  // Speculative decoding, counted on this engine: drafts proposed and verified, drafts
  // accepted, and the steps that sampled this request (outputs generated here / steps = tokens
  // per step; accepted / drafts = acceptance rate). All 0 for a request that never speculated,
  // except num_sampling_steps.
  int num_draft_tokens = 0;
  int num_accepted_tokens = 0;
  int num_sampling_steps = 0;
};

struct token_delta {
  int64_t request_id = 0;
  // New tokens. When finished by `stop`, the last one is the EOS or stop token that ended it.
  std::vector<int32_t> token_ids;
  std::vector<token_logprobs> logprobs;  // one per token when the request asked for logprobs
  // On the delta of the request's first output token, when it asked for prompt_logprobs: one per
  // prompt token after the first (a resumed request's came with its first token elsewhere).
  std::vector<prompt_token_logprob> prompt_logprobs;
  finish_reason finish = finish_reason::none;
  // A prefill-only request's last delta on its prefill instance (not a final one): the decode
  // instance goes on with the request (engine/kv_handoff.hpp).
  bool handed_off = false;
  uint64_t kv_transfer_id = 0;             // with handed_off: the transfer it was prefilled under
  std::optional<request_metrics> metrics;  // set when finished
  // The request's stop strings, on its first delta only: they ride with the tokens so the stage
  // that turns ids into text (the detokenizer) can match them without a side channel.
  std::vector<std::string> stop;
  // Likewise on the first delta: whether the text leaves special tokens out (sampling_params).
  bool skip_special_tokens = true;
  // A pooling request's embedding ([hidden_size]), on the delta of the token sampled with it.
  std::vector<float> embedding;
  // The run of the request that produced it (schedule_request::attempt). A run the router has
  // replaced may still have deltas on their way, from the very instance the new run went to
  // (the only one left): the router drops those by this number.
  uint32_t attempt = 0;

  bool finished() const { return finish != finish_reason::none; }
};

}  // namespace troupe
