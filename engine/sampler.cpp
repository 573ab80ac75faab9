#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "backends/cpu/argmax.hpp"

namespace troupe {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 53 bits.
double to_unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace

std::optional<std::string> check_sampling_params(const sampling_params& p) {
  // The context bound is the scheduler's to check (prompt + max_tokens against max_model_len).
  if (auto problem = validate_sampling_params(p, protocol_limits{})) return problem->field + " " + problem->problem;
  if (p.top_k < 0) return "top_k: -1 (off) must be normalized to 0 before it reaches the engine";
  return {};
}

bool uses_penalties(const sampling_params& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

sampler::sampler(uint64_t unseeded_seed) : rng_(unseeded_seed) {}

sampled_token sampler::sample(std::span<const float> logits, const sampling_params& params,
                              const sample_context& context) {
  if (logits.empty()) throw std::runtime_error("sampler: empty logits row");
  sampled_token out;
  out.request_id = context.request_id;
  const bool greedy = params.temperature == 0.0f || params.top_k == 1;
  // Penalties and biases change the row: the fast paths below read the raw logits.
  const bool penalties = uses_penalties(params) || !params.logit_bias.empty();
  if (greedy && !penalties && !context.constrained) {
    out.token_id = argmax(logits);  // the common case: no copy of the row
    if (params.logprobs >= 0) fill_logprobs(logits, params.logprobs, out);
    return out;
  }
  if (context.constrained && greedy && !penalties) {
    // The best allowed token, without building a masked row (ties: the lowest id, as argmax).
    if (context.allowed_token_ids.empty()) mask_logits(logits, context);  // throws, naming the request
    const int32_t best_any = argmax(logits);
    const auto& bits = context.allowed_bits;
    if (static_cast<size_t>(best_any) / 64 < bits.size() &&
        (bits[static_cast<size_t>(best_any) / 64] >> (best_any & 63) & 1)) {
      out.token_id = best_any;  // the model's own choice is allowed: no scan of the mask
      if (params.logprobs >= 0) fill_logprobs(logits, params.logprobs, out);
      return out;
    }
    out.token_id = -1;
    float best = 0.0f;
    for (int32_t t : context.allowed_token_ids) {
      if (t < 0 || static_cast<size_t>(t) >= logits.size()) mask_logits(logits, context);  // throws
      const float l = logits[static_cast<size_t>(t)];
      if (out.token_id < 0 || l > best || (l == best && t < out.token_id)) {
        out.token_id = t;
        best = l;
      }
    }
    if (params.logprobs >= 0) fill_logprobs(logits, params.logprobs, out);
    return out;
  }
  prepare_row(logits, params, context);
  if (greedy) {
    out.token_id = argmax(work_);
  } else {
    out.token_id = sample_filtered(params, uniform_for(params, context, 0));
  }
  if (params.logprobs >= 0) fill_logprobs(logits, params.logprobs, out);
  return out;
}

void sampler::prepare_row(std::span<const float> logits, const sampling_params& params, const sample_context& context) {
  if (context.constrained) {
    mask_logits(logits, context);
  } else {
    work_.assign(logits.begin(), logits.end());
  }
  for (const token_bias& b : params.logit_bias) {
    // Ids past the model's rows (a tokenizer larger than the model) have no logit to move.
    if (b.token_id >= 0 && static_cast<size_t>(b.token_id) < work_.size())
      work_[static_cast<size_t>(b.token_id)] += b.bias;
  }
  if (uses_penalties(params)) apply_penalties(params, context);
}

// Stream 0 is the draw sample() has always made; the acceptance test of speculative decoding
// draws from stream 1, so a seeded request's choices stay independent of each other.
double sampler::uniform_for(const sampling_params& params, const sample_context& context, uint64_t stream) {
  if (!params.seed) return to_unit(rng_());
  uint64_t key = *params.seed ^ splitmix64(static_cast<uint64_t>(context.output_index));
  if (stream != 0) key = splitmix64(key ^ splitmix64(0x5bd1e995ull + stream));
  return to_unit(splitmix64(key));
}

sampled_token sampler::verify(std::span<const float> logits, const sampling_params& params,
                              const sample_context& context, int32_t draft, bool& accepted) {
  const bool greedy = params.temperature == 0.0f || params.top_k == 1;
  if (greedy) {
    sampled_token out = sample(logits, params, context);
    accepted = out.token_id == draft;
    return out;
  }
  if (logits.empty()) throw std::runtime_error("sampler: empty logits row");
  sampled_token out;
  out.request_id = context.request_id;
  prepare_row(logits, params, context);
  int n = filter_candidates(params);
  double total = 0.0;
  int draft_at = -1;
  for (int i = 0; i < n; ++i) {
    total += work_[order_[i]];
    if (order_[i] == draft) draft_at = i;
  }
  const double draft_mass = draft_at < 0 ? 0.0 : work_[draft];
  // Accept with probability p(draft) = mass / total; the residual max(p - q, 0) of a point-mass
  // q is p without the draft, renormalized, which is what pick() draws from below.
  accepted = draft_at >= 0 && (n == 1 || uniform_for(params, context, 1) * total < draft_mass);
  if (accepted) {
    out.token_id = draft;
  } else {
    if (draft_at >= 0) std::swap(order_[draft_at], order_[--n]);
    out.token_id = pick(n, uniform_for(params, context, 0));
  }
  if (params.logprobs >= 0) fill_logprobs(logits, params.logprobs, out);
  return out;
}

void sampler::mask_logits(std::span<const float> logits, const sample_context& context) {
  if (context.allowed_token_ids.empty()) {
    throw std::runtime_error("sampler: request " + std::to_string(context.request_id) + " allows no token");
  }
  const auto& bits = context.allowed_bits;
  if (bits.size() * 64 >= logits.size() && context.allowed_token_ids.size() * 2 > logits.size()) {
    // A wide mask: copy the row and knock out the few tokens it refuses.
    work_.assign(logits.begin(), logits.end());
    for (size_t word = 0; word < bits.size(); ++word) {
      for (uint64_t refused = ~bits[word]; refused != 0; refused &= refused - 1) {
        const size_t t = word * 64 + static_cast<size_t>(__builtin_ctzll(refused));
        if (t >= work_.size()) break;
        work_[t] = -std::numeric_limits<float>::infinity();
      }
    }
    return;
  }
  work_.assign(logits.size(), -std::numeric_limits<float>::infinity());
  for (int32_t t : context.allowed_token_ids) {
    if (t < 0 || static_cast<size_t>(t) >= logits.size()) {
      throw std::runtime_error("sampler: allowed token id " + std::to_string(t) + " of request " +
                               std::to_string(context.request_id) + " is outside the vocabulary of " +
                               std::to_string(logits.size()));
    }
    work_[static_cast<size_t>(t)] = logits[static_cast<size_t>(t)];
  }
}

void sampler::apply_penalties(const sampling_params& params, const sample_context& context) {
  const size_t vocab = work_.size();
  if (counts_.size() != vocab) {
    counts_.assign(vocab, 0);
    seen_.assign(vocab, 0);
  }
  touched_.clear();
  for (size_t i = 0; i < context.penalty_token_ids.size(); ++i) {
    int32_t t = context.penalty_token_ids[i];
    if (t < 0 || static_cast<size_t>(t) >= vocab) {
      throw std::runtime_error("sampler: token id " + std::to_string(t) + " of request " +
                               std::to_string(context.request_id) + " is outside the vocabulary of " +
                               std::to_string(vocab));
    }
    if (!seen_[t]) {
      seen_[t] = 1;
      touched_.push_back(t);
    }
    if (static_cast<int32_t>(i) >= context.num_prompt_tokens) ++counts_[t];
  }
  const float rp = params.repetition_penalty;
  for (int32_t t : touched_) {
    float l = work_[t];
    // Dividing a positive logit and multiplying a negative one both make the token less likely.
    if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp;
    if (counts_[t] > 0) l -= params.presence_penalty + params.frequency_penalty * static_cast<float>(counts_[t]);
    work_[t] = l;
    seen_[t] = 0;
    counts_[t] = 0;
  }
}

// Order of filters: top-k, then top-p over what is left, then min-p (relative to the most
// likely token, which the first two always keep). No full sort of the vocabulary.
int sampler::filter_candidates(const sampling_params& params) {
  const int vocab = static_cast<int>(work_.size());
  const float inv_t = 1.0f / params.temperature;
  const float max_logit = *std::max_element(work_.begin(), work_.end());
  // Subtracting the max before scaling keeps tiny temperatures from overflowing.
  for (float& l : work_) l = std::exp((l - max_logit) * inv_t);  // unnormalized probabilities, max 1

  order_.resize(static_cast<size_t>(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  auto more_likely = [this](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  int n = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    std::nth_element(order_.begin(), order_.begin() + params.top_k, order_.end(), more_likely);
    n = params.top_k;
  }
  if (params.top_p < 1.0f) {
    double total = 0.0;
    for (int i = 0; i < n; ++i) total += work_[order_[i]];
    const double target = params.top_p * total;
    // Sort a growing head until it holds the wanted mass, each round selecting (nth_element)
    // and sorting only the next slice: O(V + m log m) for a head of m tokens.
    int sorted = 0;
    int keep = 0;
    double mass = 0.0;
    while (mass < target && keep < n) {
      const int head = std::min(n, std::max(64, sorted * 4));
      std::nth_element(order_.begin() + sorted, order_.begin() + head - 1, order_.begin() + n, more_likely);
      std::sort(order_.begin() + sorted, order_.begin() + head, more_likely);
      sorted = head;
      while (keep < sorted && mass < target) mass += work_[order_[keep++]];
    }
    n = std::max(keep, 1);
  }
  if (params.min_p > 0.0f) {
    float best = 0.0f;
    for (int i = 0; i < n; ++i) best = std::max(best, work_[order_[i]]);
    const float threshold = params.min_p * best;
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      if (work_[order_[i]] >= threshold) order_[kept++] = order_[i];
    }
    n = kept;
  }
  return n;
}

int32_t sampler::pick(int n, double uniform) const {
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += work_[order_[i]];
  const double point = uniform * total;
  double cumulative = 0.0;
  for (int i = 0; i < n; ++i) {
    cumulative += work_[order_[i]];
    if (point < cumulative) return order_[i];
  }
  return order_[n - 1];
}

int32_t sampler::sample_filtered(const sampling_params& params, double uniform) {
  return pick(filter_candidates(params), uniform);
}

double sampler::log_normalizer(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  return max_logit + std::log(sum);
}

void sampler::top_logprobs(std::span<const float> logits, int top_n, double log_z, std::vector<int32_t>& ids,
                           std::vector<float>& logprobs) {
  const int vocab = static_cast<int>(logits.size());
  top_n = std::min(top_n, vocab);
  ids.clear();
  logprobs.clear();
  if (top_n <= 0) return;
  order_.resize(static_cast<size_t>(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  std::partial_sort(order_.begin(), order_.begin() + top_n, order_.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < top_n; ++i) {
    ids.push_back(order_[i]);
    logprobs.push_back(static_cast<float>(logits[order_[i]] - log_z));
  }
}

void sampler::fill_logprobs(std::span<const float> logits, int top_n, sampled_token& out) {
  const double log_z = log_normalizer(logits);
  out.logprob = static_cast<float>(logits[out.token_id] - log_z);
  top_logprobs(logits, top_n, log_z, out.top_token_ids, out.top_logprobs);
}

prompt_token_logprob sampler::prompt_logprob(std::span<const float> logits, int32_t token, int top_n) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw std::invalid_argument("sampler: prompt token " + std::to_string(token) + " is outside the vocabulary of " +
                                std::to_string(logits.size()));
  }
  prompt_token_logprob out;
  const double log_z = log_normalizer(logits);
  out.token_id = token;
  out.logprob = static_cast<float>(logits[token] - log_z);
  const float own = logits[token];
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float l) { return l > own; }));
  top_logprobs(logits, top_n, log_z, out.top_token_ids, out.top_logprobs);
  return out;
}

}  // namespace troupe
