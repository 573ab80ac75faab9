#pragma once
// One request's walk through its grammar: the tokens allowed next, and the state after each
// token sampled. The rules:
// - a content token is allowed when the automaton accepts its bytes from the current state;
// - an end (EOS) token only where the automaton accepts, so EOS never cuts an output short;
// - the length rule: with n tokens left (max_tokens - generated, this one included), a content
//   token is allowed only when the state it leads to can still reach acceptance within n - 2
//   tokens (token_masks::budget), keeping the last token for EOS. Every state keeps a
//   single-byte token that makes progress, so the rule never leaves nothing allowed, and the
//   output is complete and ended by EOS (finish_reason "stop") by the time max_tokens runs out,
//   whatever the weights. The doors refuse a max_tokens below the shortest output + 1.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "grammar/token_masks.hpp"

namespace troupe {

class grammar_matcher {
 public:
  explicit grammar_matcher(std::shared_ptr<token_masks> masks);

  // The tokens allowed next when `tokens_left` tokens (this one included) may still be
  // generated. Valid until the next call. Never empty.
  std::span<const int32_t> allowed(int tokens_left);
  // The last allowed() as one bit per token id, when it was the state's whole mask (the common
  // case); empty otherwise. Lets the sampler test a token, or mask a wide set, without a scan.
  std::span<const uint64_t> allowed_bits() const { return bits_; }
  // Moves past `token`. False (and nothing changes) when the grammar does not allow it here.
  bool advance(int32_t token);

  bool accepting() const { return ended_ || masks_->dfa().accepting(state_); }
  bool ended() const { return ended_; }  // an end token was taken
  int32_t state() const { return state_; }
  const token_masks& masks() const { return *masks_; }

 private:
  std::shared_ptr<token_masks> masks_;
  int32_t state_;
  bool ended_ = false;
  std::vector<int32_t> scratch_;
  std::span<const uint64_t> bits_;
};

}  // namespace troupe
