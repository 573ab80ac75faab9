#include "grammar/token_masks.hpp"

#include <algorithm>

namespace troupe {

token_masks::token_masks(std::shared_ptr<const compiled_grammar> grammar,
                         std::shared_ptr<const token_vocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  const byte_dfa& dfa = grammar_->dfa;
  const size_t num_states = static_cast<size_t>(dfa.num_states());
  masks_.resize(num_states);
  walk_states_.resize(static_cast<size_t>(vocabulary_->max_token_bytes()) + 1);
  allowed_bits_.assign((static_cast<size_t>(vocabulary_->size()) + 63) / 64, 0);
  next_of_.assign(static_cast<size_t>(vocabulary_->size()), byte_dfa::dead);
  // Budgets: relax until nothing changes (Bellman-Ford over single-byte edges; the automaton's
  // own byte distance is the usual answer, reached in one or two rounds).
  budget_.assign(num_states, no_budget);
  for (size_t s = 0; s < num_states; ++s) {
    if (dfa.accepting(static_cast<int32_t>(s))) budget_[s] = 0;
  }
  std::vector<uint8_t> usable;
  for (int b = 0; b < 256; ++b) {
    if (vocabulary_->has_single_byte_token(static_cast<uint8_t>(b))) usable.push_back(static_cast<uint8_t>(b));
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = num_states; s-- > 0;) {
      int32_t best = budget_[s];
      for (uint8_t b : usable) {
        const int32_t t = dfa.next(static_cast<int32_t>(s), b);
        if (t != byte_dfa::dead && budget_[static_cast<size_t>(t)] + 1 < best)
          best = budget_[static_cast<size_t>(t)] + 1;
      }
      if (best < budget_[s]) {
        budget_[s] = best;
        changed = true;
      }
    }
  }
}

size_t token_masks::memory_bytes() const {
  size_t bytes = 0;
  for (const auto& mask : masks_) {
    if (!mask) continue;
    bytes += mask->token_ids.capacity() * sizeof(int32_t) + mask->next_states.capacity() * sizeof(int32_t) +
             mask->bits.capacity() * sizeof(uint64_t);
  }
  return bytes;
}

const token_masks::state_mask& token_masks::at(int32_t state) {
  std::unique_ptr<state_mask>& slot = masks_[static_cast<size_t>(state)];
  if (slot) return *slot;
  slot = std::make_unique<state_mask>();
  const byte_dfa& dfa = grammar_->dfa;
  const auto& trie = vocabulary_->trie();
  const auto& sorted = vocabulary_->sorted_tokens();
  walk_states_[0] = state;
  size_t i = 0;
  while (i < trie.size()) {
    const token_vocabulary::trie_node& node = trie[i];
    const int32_t next = dfa.next(walk_states_[static_cast<size_t>(node.depth - 1)], node.byte);
    if (next == byte_dfa::dead) {
      i = static_cast<size_t>(node.skip);
      continue;
    }
    walk_states_[static_cast<size_t>(node.depth)] = next;
    for (int32_t k = 0; k < node.num_tokens; ++k) {
      const int32_t id = sorted[static_cast<size_t>(node.first_token + k)];
      allowed_bits_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      next_of_[static_cast<size_t>(id)] = next;
      slot->max_next_budget = std::max(slot->max_next_budget, budget_[static_cast<size_t>(next)]);
    }
    ++i;
  }
  // In id order, so that the sampler reads the logits row front to back (the trie's byte order
  // would scatter its reads over the whole row).
  slot->bits = allowed_bits_;
  for (size_t word = 0; word < allowed_bits_.size(); ++word) {
    for (uint64_t bits = allowed_bits_[word]; bits != 0; bits &= bits - 1) {
      const int32_t id = static_cast<int32_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
      slot->token_ids.push_back(id);
      slot->next_states.push_back(next_of_[static_cast<size_t>(id)]);
    }
    allowed_bits_[word] = 0;
  }
  ++num_computed_;
  return *slot;
}

}  // namespace troupe
