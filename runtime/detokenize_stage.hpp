#pragma once
// The detokenizer stage's work, without the actor: token deltas in, text deltas out, with one
// incremental detokenizer per live request (dropped when the request finishes).

#include <unordered_map>

#include "runtime/messages.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe {

class detokenize_stage {
 public:
  explicit detokenize_stage(tokenizer tok) : tokenizer_(std::move(tok)) {}

  text_batch run(token_batch batch);
  size_t num_live() const { return live_.size(); }

 private:
  tokenizer tokenizer_;
  std::unordered_map<int64_t, incremental_detokenizer> live_;
};

}  // namespace troupe
