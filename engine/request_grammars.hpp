#pragma once
// A worker's side of structured output: the served model's vocabulary (as bytes) and, per
// grammar, its token masks, cached by the grammar's source so every request with the same
// schema shares the masks computed so far. Belongs to one model runner (one thread).

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "grammar/grammar_matcher.hpp"
#include "protocol/sampling_params.hpp"

namespace troupe {

class request_grammars {
 public:
  // with_special: the same vocabulary with special tokens spelled (guided_vocabulary.hpp), for
  // requests whose text keeps them; null: such requests use the plain one.
  void set_vocabulary(std::shared_ptr<const token_vocabulary> vocabulary,
                      std::shared_ptr<const token_vocabulary> with_special = nullptr) {
    vocabulary_ = std::move(vocabulary);
    with_special_ = std::move(with_special);
    masks_.clear();
  }
  bool has_vocabulary() const { return vocabulary_ != nullptr; }

  // A matcher at the start of `guided`'s grammar. Throws std::runtime_error naming the request
  // and the problem (no vocabulary, a constraint that does not compile).
  // special_tokens_in_text: the request's text keeps special tokens (skip_special_tokens off).
  std::unique_ptr<grammar_matcher> start(const guided_decoding& guided, int64_t request_id,
                                         bool special_tokens_in_text = false);

  size_t num_grammars() const { return masks_.size(); }

 private:
  std::shared_ptr<const token_vocabulary> vocabulary_;
  std::shared_ptr<const token_vocabulary> with_special_;
  std::unordered_map<std::string, std::shared_ptr<token_masks>> masks_;  // by guided_cache_key
};

}  // namespace troupe
