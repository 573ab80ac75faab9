#pragma once
// Prompt lookup: drafts copied from the request's own text. The last n tokens of the history
// (n from max_n down to min_n) are searched for earlier in the history, most recent occurrence
// first; the tokens that followed that occurrence are the drafts. Free to run and good where the
// output repeats its input (summaries, edits, code changes, extraction); no state per request.

#include "engine/draft_proposer.hpp"

namespace troupe {

struct ngram_settings {
  int min_n = 2;  // shorter matches guess too often to pay for their verification
  int max_n = 4;
  // How far back the search looks, in tokens: bounds the cost per step on long histories.
  int max_lookback = 4096;

  // Throws std::runtime_error naming the bad field.
  void validate() const;
};

class ngram_proposer final : public draft_proposer {
 public:
  explicit ngram_proposer(ngram_settings settings = {});

  void propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) override;
  const char* name() const override { return "ngram"; }

  // The drafts for one history (at most max_drafts); empty when no suffix recurs.
  std::vector<int32_t> lookup(std::span<const int32_t> history, int max_drafts) const;

 private:
  ngram_settings settings_;
};

}  // namespace troupe
