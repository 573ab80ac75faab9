#include "doors/speculative_usage.hpp"

#include <algorithm>
#include <limits>

namespace troupe {

int num_generated_here(const request_metrics& m) {
  return std::max(0, std::min(m.num_output_tokens, m.num_sampling_steps + m.num_accepted_tokens));
}

void speculative_tally::add(const request_metrics& m) {
  num_draft_tokens += static_cast<uint64_t>(std::max(0, m.num_draft_tokens));
  num_accepted_tokens += static_cast<uint64_t>(std::max(0, m.num_accepted_tokens));
  num_generated_tokens += static_cast<uint64_t>(num_generated_here(m));
  num_sampling_steps += static_cast<uint64_t>(std::max(0, m.num_sampling_steps));
}

double speculative_tally::acceptance_rate() const {
  return num_draft_tokens > 0 ? static_cast<double>(num_accepted_tokens) / static_cast<double>(num_draft_tokens) : 0.0;
}

double speculative_tally::tokens_per_step() const {
  return num_sampling_steps > 0 ? static_cast<double>(num_generated_tokens) / static_cast<double>(num_sampling_steps)
                                : 0.0;
}

std::optional<speculative_usage> speculative_tally::usage() const {
  if (num_draft_tokens == 0) return std::nullopt;
  // Sums over one HTTP request's choices fit an int as each count did; clamp all the same.
  auto as_int = [](uint64_t n) { return static_cast<int>(std::min<uint64_t>(n, std::numeric_limits<int>::max())); };
  return speculative_usage{as_int(num_draft_tokens), as_int(num_accepted_tokens), acceptance_rate(), tokens_per_step()};
}

std::optional<speculative_usage> speculative_usage_of(const request_metrics& m) {
  speculative_tally tally;
  tally.add(m);
  return tally.usage();
}

}  // namespace troupe
