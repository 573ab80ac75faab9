#include "engine/ngram_proposer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

void ngram_settings::validate() const {
  if (min_n < 1) throw std::runtime_error("ngram: min_n must be at least 1, got " + std::to_string(min_n));
  if (max_n < min_n) {
    throw std::runtime_error("ngram: max_n " + std::to_string(max_n) + " is below min_n " + std::to_string(min_n));
  }
  if (max_lookback < max_n + 1) {
    throw std::runtime_error("ngram: max_lookback " + std::to_string(max_lookback) + " cannot hold an n-gram of " +
                             std::to_string(max_n) + " and a token after it");
  }
}

ngram_proposer::ngram_proposer(ngram_settings settings) : settings_(settings) { settings_.validate(); }

void ngram_proposer::propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) {
  drafts.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) drafts[i] = lookup(requests[i].history, requests[i].max_drafts);
}

std::vector<int32_t> ngram_proposer::lookup(std::span<const int32_t> history, int max_drafts) const {
  std::vector<int32_t> drafts;
  const int length = static_cast<int>(history.size());
  if (max_drafts <= 0) return drafts;
  const int window_begin = std::max(0, length - settings_.max_lookback);
  // Longer suffixes first: a longer match predicts what follows better.
  for (int n = std::min(settings_.max_n, length - 1); n >= settings_.min_n; --n) {
    const int32_t* suffix = history.data() + length - n;
    // Occurrences starting at `start` end before the suffix itself, with a token after them;
    // the most recent one is the likeliest to continue as the text does now.
    for (int start = length - n - 1; start >= window_begin; --start) {
      if (!std::equal(suffix, suffix + n, history.data() + start)) continue;
      const int follow = start + n;
      const int count = std::min(max_drafts, length - follow);
      drafts.assign(history.begin() + follow, history.begin() + follow + count);
      return drafts;
    }
  }
  return drafts;
}

}  // namespace troupe
