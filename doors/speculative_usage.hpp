#pragma once
// Speculative decoding's figures as the doors report them (docs/protocol.md, "usage"): the
// drafts the engine verified for a request, how many it accepted, and the output tokens per step
// that sampled it. One request's come from its final request_metrics; an HTTP request with
// several choices sums its choices', and /metrics sums every finished request's.

#include <cstdint>
#include <optional>

#include "engine/token_delta.hpp"
#include "protocol/replies.hpp"

namespace troupe {

// The outputs a request's sampling steps on its last engine produced. Each step yields one
// token plus the drafts it accepted (the scheduler counts only drafts that became outputs), so
// that is steps + accepted. request_metrics carries no count of resumed outputs, so this does
// not subtract them from num_output_tokens, which includes outputs generated elsewhere (a
// request resumed after failover, or decoded after a prefill instance's hand-off); the output
// count only caps it, for tokens the detokenizer dropped after a stop string matched.
int num_generated_here(const request_metrics& m);

struct speculative_tally {
  uint64_t num_draft_tokens = 0;
  uint64_t num_accepted_tokens = 0;
  uint64_t num_generated_tokens = 0;  // num_generated_here, summed
  uint64_t num_sampling_steps = 0;

  void add(const request_metrics& m);
  // accepted / drafts; 0 with no drafts.
  double acceptance_rate() const;
  // generated / sampling steps; 0 with no steps.
  double tokens_per_step() const;
  // The usage object; none when no draft was verified (speculation off, or nothing proposed).
  std::optional<speculative_usage> usage() const;
};

// One request's usage.speculative.
std::optional<speculative_usage> speculative_usage_of(const request_metrics& m);

}  // namespace troupe
