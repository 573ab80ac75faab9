#pragma once
// Added tokens (tokenizer.json "added_tokens"): found in the raw text before normalization and
// the model, the way the reference implementation does it: leftmost-longest match of their
// contents, lstrip/rstrip trimming the neighbouring text, normalized ones matched after
// normalization. single_word is not honoured, as in the reference.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

struct added_token {
  std::int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// One cut of a text: either an added token (token >= 0) or plain text to encode.
struct text_section {
  std::string_view text;
  std::int32_t token = -1;
  std::size_t index = 0;  // position among the sections of the raw text
};

class added_vocabulary {
 public:
  added_vocabulary() = default;
  // normalize(content) gives the matching form of tokens with normalized == true.
  template <typename Normalize>
  added_vocabulary(std::vector<added_token> tokens, Normalize&& normalize) : tokens_(std::move(tokens)) {
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i].normalized)
        normalized_.insert(normalize(tokens_[i].content), static_cast<std::int32_t>(i));
      else
        raw_.insert(tokens_[i].content, static_cast<std::int32_t>(i));
    }
  }

  const std::vector<added_token>& tokens() const { return tokens_; }

  // Cuts raw text at the added tokens matched before normalization; lstrip/rstrip applied.
  void split_raw(std::string_view text, std::vector<text_section>& out) const { split(raw_, text, out); }
  // Cuts normalized text at the tokens matched after normalization.
  void split_normalized(std::string_view text, std::vector<text_section>& out) const { split(normalized_, text, out); }
  bool has_normalized_tokens() const { return !normalized_.empty(); }

 private:
  // A byte trie with sorted children; first_bytes_ rejects most positions with one lookup.
  class trie {
   public:
    trie() : nodes_(1) {}
    void insert(std::string_view key, std::int32_t value);
    // Length of the longest key starting at text[pos] and its value, or {0, -1}.
    std::pair<std::size_t, std::int32_t> longest_match(std::string_view text, std::size_t pos) const;
    bool empty() const { return nodes_.size() == 1; }

   private:
    struct node {
      std::vector<std::pair<unsigned char, std::int32_t>> children;
      std::int32_t value = -1;
    };
    std::vector<node> nodes_;
    bool first_bytes_[256] = {};
  };

  void split(const trie& matcher, std::string_view text, std::vector<text_section>& out) const;

  std::vector<added_token> tokens_;
  trie raw_;
  trie normalized_;
};

}  // namespace troupe
