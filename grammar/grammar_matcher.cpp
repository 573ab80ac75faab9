#include "grammar/grammar_matcher.hpp"

#include <algorithm>

namespace troupe {

grammar_matcher::grammar_matcher(std::shared_ptr<token_masks> masks)
    : masks_(std::move(masks)), state_(masks_->dfa().start()) {}

std::span<const int32_t> grammar_matcher::allowed(int tokens_left) {
  const auto& ends = masks_->vocabulary().end_ids();
  bits_ = {};
  if (ended_) return ends;  // ignore_eos after the end: only more ends
  const bool accepts = masks_->dfa().accepting(state_);
  const token_masks::state_mask& mask = masks_->at(state_);
  // A content token leaves room for itself and for the EOS that ends the output after it.
  const int32_t room = std::max(tokens_left - 2, 0);
  if (!accepts && !mask.token_ids.empty() && mask.max_next_budget <= room && tokens_left >= 2) {
    bits_ = mask.bits;
    return mask.token_ids;  // the common case: no copy
  }
  scratch_.clear();
  if (accepts) scratch_.assign(ends.begin(), ends.end());
  int32_t closest = token_masks::no_budget;
  for (int32_t next : mask.next_states) closest = std::min(closest, masks_->budget(next));
  // Past the point where the rule can be kept (max_tokens below the shortest output), head for
  // acceptance by the shortest way there is.
  const int32_t limit = accepts || closest <= room ? room : closest;
  for (size_t i = 0; i < mask.token_ids.size() && (tokens_left >= 2 || !accepts); ++i) {
    if (masks_->budget(mask.next_states[i]) <= limit) scratch_.push_back(mask.token_ids[i]);
  }
  // A vocabulary without a token for the byte the grammar needs next: ending is all that is left.
  if (scratch_.empty()) return ends;
  return scratch_;
}

bool grammar_matcher::advance(int32_t token) {
  const token_vocabulary& vocabulary = masks_->vocabulary();
  if (vocabulary.is_end(token)) {
    if (!accepting()) return false;
    ended_ = true;
    return true;
  }
  if (ended_ || token < 0 || token >= vocabulary.size() || vocabulary.bytes(token).empty()) return false;
  const int32_t next = masks_->dfa().walk(state_, vocabulary.bytes(token));
  if (next == byte_dfa::dead) return false;
  state_ = next;
  return true;
}

}  // namespace troupe
