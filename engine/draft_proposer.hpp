#pragma once
// Where speculative decoding's draft tokens come from. The model runner asks its proposer, once
// per step, for drafts for every entry the scheduler gave draft slots, then verifies them all in
// the step's one forward of the target model (engine/model_runner.hpp). Two proposers exist:
// n-gram prompt lookup (engine/ngram_proposer.hpp, needs nothing) and a draft model of the same
// vocabulary (engine/draft_model_proposer.hpp). Plain classes, used on the worker's thread only.
//
// Drafts are only ever proposals: whatever a proposer returns, the target model's verification
// decides the output (greedy outputs equal plain decoding's; sampled ones follow the target's
// distribution), so a poor proposer costs speed, never correctness.

#include <cstdint>
#include <span>
#include <vector>

namespace troupe {

struct draft_request {
  int64_t request_id = 0;
  // The request's prompt and every output so far; its last token is the step's last input
  // (the token the verification's first position follows).
  std::span<const int32_t> history;
  int max_drafts = 0;  // at most this many (the entry's draft slots, > 0)
};

class draft_proposer {
 public:
  virtual ~draft_proposer() = default;

  // Fills drafts[i] (cleared first) with at most requests[i].max_drafts token ids for request i;
  // fewer, or none, when it has no good guess. drafts.size() becomes requests.size().
  virtual void propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) = 0;

  // The request ended or was preempted: drop whatever is kept for it.
  virtual void forget(int64_t request_id) {}

  // For logs and /metrics: "ngram" or "draft_model".
  virtual const char* name() const = 0;
};

}  // namespace troupe
