#pragma once
// Per automaton state, the tokens whose bytes the automaton accepts from there (and the state
// each leads to), computed the first time a state is reached and kept: one walk of the
// vocabulary's trie per state, which skips every subtree whose prefix the automaton refuses.
// One token_masks belongs to one (grammar, vocabulary) pair and to one thread (a worker's model
// runner); it is not thread-safe.
//
// Also per state: the budget, the fewest tokens that lead to acceptance using single-byte
// tokens only (always available in byte-level and byte-fallback vocabularies), which the
// length rule of grammar_matcher relies on.

#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/guided_grammar.hpp"
#include "grammar/token_vocabulary.hpp"

namespace troupe {

class token_masks {
 public:
  static constexpr int32_t no_budget = 1 << 29;  // acceptance not reachable by single bytes

  struct state_mask {
    std::vector<int32_t> token_ids;    // [allowed] ascending
    std::vector<int32_t> next_states;  // [allowed] the state after each
    std::vector<uint64_t> bits;        // [vocab / 64] the same set, one bit per token id
    int32_t max_next_budget = 0;       // the largest budget among next_states
  };

  token_masks(std::shared_ptr<const compiled_grammar> grammar, std::shared_ptr<const token_vocabulary> vocabulary);

  const state_mask& at(int32_t state);
  int32_t budget(int32_t state) const { return budget_[static_cast<size_t>(state)]; }
  const byte_dfa& dfa() const { return grammar_->dfa; }
  const token_vocabulary& vocabulary() const { return *vocabulary_; }
  size_t num_states_computed() const { return num_computed_; }
  // What the masks computed so far hold (a wide state of a 128k vocabulary: about 1 MB).
  size_t memory_bytes() const;

 private:
  std::shared_ptr<const compiled_grammar> grammar_;
  std::shared_ptr<const token_vocabulary> vocabulary_;
  std::vector<std::unique_ptr<state_mask>> masks_;  // [num_states] null until reached
  std::vector<int32_t> budget_;                     // [num_states]
  std::vector<int32_t> walk_states_;                // [max_token_bytes + 1]
  std::vector<uint64_t> allowed_bits_;              // [vocab / 64] scratch of at(), kept zeroed
  std::vector<int32_t> next_of_;                    // [vocab] scratch of at()
  size_t num_computed_ = 0;
};

}  // namespace troupe
