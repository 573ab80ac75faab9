#include "grammar/token_vocabulary.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe {

token_vocabulary::token_vocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)), is_end_(bytes_.size(), 0) {
  if (end_ids_.empty())
    throw std::invalid_argument("token_vocabulary: a constrained output needs an end (EOS) token id");
  for (int32_t id : end_ids_) {
    if (id < 0 || id >= size()) {
      throw std::invalid_argument("token_vocabulary: end token id " + std::to_string(id) +
                                  " is outside the vocabulary of " + std::to_string(size()));
    }
    is_end_[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id = 0; id < size(); ++id) {
    const std::string& b = bytes_[static_cast<size_t>(id)];
    if (b.empty() || is_end(id)) continue;
    sorted_tokens_.push_back(id);
    if (b.size() == 1) single_byte_[static_cast<uint8_t>(b[0])] = 1;
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int32_t>(b.size()));
  }
  std::sort(sorted_tokens_.begin(), sorted_tokens_.end(),
            [this](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });

  // Preorder trie from the sorted strings: a token shares the nodes of its common prefix with
  // the token before it.
  std::vector<int32_t> path;  // path[d]: the node at depth d + 1 on the current path
  const std::string* previous = nullptr;
  for (size_t k = 0; k < sorted_tokens_.size(); ++k) {
    const std::string& b = bytes_[static_cast<size_t>(sorted_tokens_[k])];
    size_t common = 0;
    if (previous) {
      while (common < b.size() && common < previous->size() && b[common] == (*previous)[common]) ++common;
    }
    path.resize(common);
    if (common == b.size()) {
      ++trie_[static_cast<size_t>(path.back())].num_tokens;  // the same bytes as the token before
    } else {
      for (size_t d = common; d < b.size(); ++d) {
        trie_node node;
        node.byte = static_cast<uint8_t>(b[d]);
        node.depth = static_cast<int32_t>(d + 1);
        path.push_back(static_cast<int32_t>(trie_.size()));
        trie_.push_back(node);
      }
      trie_.back().first_token = static_cast<int32_t>(k);
      trie_.back().num_tokens = 1;
    }
    previous = &b;
  }
  std::vector<int32_t> open;
  for (size_t i = 0; i < trie_.size(); ++i) {
    while (!open.empty() && trie_[static_cast<size_t>(open.back())].depth >= trie_[i].depth) {
      trie_[static_cast<size_t>(open.back())].skip = static_cast<int32_t>(i);
      open.pop_back();
    }
    open.push_back(static_cast<int32_t>(i));
  }
  for (int32_t i : open) trie_[static_cast<size_t>(i)].skip = static_cast<int32_t>(trie_.size());
}

}  // namespace troupe
