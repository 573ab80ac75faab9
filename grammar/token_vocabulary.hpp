#pragma once
// The tokenizer's vocabulary as the grammar sees it: the bytes each token id adds to the output
// text, the ids that end an output (EOS), and a trie over the bytes, stored in preorder, so that
// the tokens an automaton state allows are found in one walk that skips every subtree whose
// prefix the automaton refuses.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

class token_vocabulary {
 public:
  struct trie_node {
    uint8_t byte = 0;
    int32_t depth = 0;        // 1 for a token's first byte
    int32_t skip = 0;         // the next node outside this one's subtree
    int32_t first_token = 0;  // tokens whose bytes end here: sorted_tokens()[first, first + num)
    int32_t num_tokens = 0;
  };

  // bytes[id]: what token id adds to the text; empty for tokens that never appear in generated
  // text (special and control tokens). end_ids: the ids that end an output; at least one.
  // Throws std::invalid_argument when there is no end id or an end id is outside `bytes`.
  token_vocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const { return id >= 0 && id < size() && is_end_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool has_single_byte_token(uint8_t byte) const { return single_byte_[byte] != 0; }

  const std::vector<trie_node>& trie() const { return trie_; }
  const std::vector<int32_t>& sorted_tokens() const { return sorted_tokens_; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

 private:
  std::vector<std::string> bytes_;  // [vocab]
  std::vector<int32_t> end_ids_;
  std::vector<uint8_t> is_end_;                                      // [vocab]
  std::vector<uint8_t> single_byte_ = std::vector<uint8_t>(256, 0);  // [256]
  std::vector<trie_node> trie_;                                      // preorder
  std::vector<int32_t> sorted_tokens_;                               // token ids with bytes, sorted by their bytes
  int32_t max_token_bytes_ = 0;
};

}  // namespace troupe
