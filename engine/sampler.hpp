#pragma once
// Turns one row of logits into a token, per request: penalties, then greedy or temperature
// sampling with top-k, top-p and min-p, and the logprobs the request asked for.
//
// A seeded request draws its k-th output token from a generator keyed by (seed, k), so the same
// request samples the same tokens whatever else shares its batch.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/step_plan.hpp"
#include "protocol/sampling_params.hpp"

namespace troupe {

// What the sampler needs of the sequence besides its logits.
struct sample_context {
  int64_t request_id = 0;
  int32_t output_index = 0;                    // which output token is being sampled
  std::span<const int32_t> penalty_token_ids;  // prompt then outputs; may be empty without penalties
  int32_t num_prompt_tokens = 0;
  // Structured output: only these tokens may be sampled (grammar_matcher::allowed; never empty).
  // The mask comes first: penalties, greedy, temperature, top-k/p and min-p see only them.
  bool constrained = false;
  std::span<const int32_t> allowed_token_ids;
  std::span<const uint64_t> allowed_bits;  // [vocab / 64] the same set, when at hand (or empty)
};

// What is wrong with `params`, or nothing when they are usable: the doors' one check
// (validate_sampling_params, protocol/sampling_params.hpp), and that they were normalized (top_k
// -1 made 0), as every door and `troupe generate` do before a request reaches the engine.
std::optional<std::string> check_sampling_params(const sampling_params& params);
bool uses_penalties(const sampling_params& params);

class sampler {
 public:
  explicit sampler(uint64_t unseeded_seed = std::random_device{}());

  // logits: [vocab_size] the model's raw logits for the row (left untouched).
  sampled_token sample(std::span<const float> logits, const sampling_params& params, const sample_context& context);

  // Speculative decoding: the token a position yields when the proposer drafted `draft` there,
  // and whether the draft is `accepted`. Greedy requests: the token sample() gives, accepted
  // when it is the draft. Sampled requests: the draft is accepted with the probability the
  // request's distribution (after mask, penalties, temperature, top-k/p, min-p) gives it, and
  // otherwise a token is drawn from that distribution with the draft taken out: rejection
  // sampling with a point-mass proposal, so the output follows exactly the distribution
  // sample() draws from. A seeded request's draws are keyed by (seed, output index) as sample()'s.
  sampled_token verify(std::span<const float> logits, const sampling_params& params, const sample_context& context,
                       int32_t draft, bool& accepted);

  // prompt_logprobs: the logprob and rank of `token` in the raw distribution of `logits`, and the
  // top_n most likely tokens, computed exactly as a sampled token's logprobs are (so a prompt
  // token and the same token sampled at the same position get the same numbers).
  prompt_token_logprob prompt_logprob(std::span<const float> logits, int32_t token, int top_n);

 private:
  void apply_penalties(const sampling_params& params, const sample_context& context);
  void mask_logits(std::span<const float> logits, const sample_context& context);
  // Leaves the request's candidates in order_[0, n) with their unnormalized probabilities in
  // work_ (which holds processed logits on entry) and returns n.
  int filter_candidates(const sampling_params& params);
  // The candidate at `uniform` of the candidates' total mass.
  int32_t pick(int num_candidates, double uniform) const;
  int32_t sample_filtered(const sampling_params& params, double uniform);
  // The row with the request's mask and penalties applied, in work_.
  void prepare_row(std::span<const float> logits, const sampling_params& params, const sample_context& context);
  double uniform_for(const sampling_params& params, const sample_context& context, uint64_t stream);
  void fill_logprobs(std::span<const float> logits, int top_n, sampled_token& out);
  // log(sum(exp(logits))), with the max taken out first.
  static double log_normalizer(std::span<const float> logits);
  // The top_n most likely tokens' ids and logprobs (ties: the lower id first).
  void top_logprobs(std::span<const float> logits, int top_n, double log_z, std::vector<int32_t>& ids,
                    std::vector<float>& logprobs);

  std::vector<float> work_;      // [vocab_size] processed logits, then unnormalized probabilities
  std::vector<int32_t> order_;   // [vocab_size] candidate token ids
  std::vector<int32_t> counts_;  // [vocab_size] output occurrences (penalties), kept zeroed
  std::vector<uint8_t> seen_;    // [vocab_size] in prompt or output (penalties), kept zeroed
  std::vector<int32_t> touched_;
  std::mt19937_64 rng_;  // for requests without a seed
};

}  // namespace troupe
