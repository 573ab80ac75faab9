#pragma once
// The regexes of tokenizer.json files are written for Oniguruma (the Rust tokenizers crate). They
// are translated to PCRE2 (UTF mode, JIT) so that the classes mean what the reference
// implementation means: \s is Unicode White_Space and (?i:...) folds ASCII letters only.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace troupe {

// Oniguruma syntax -> PCRE2 syntax for the subset tokenizers use; throws std::runtime_error on a
// construct it cannot translate faithfully.
std::string translate_oniguruma_pattern(std::string_view pattern);

class unicode_regex {
 public:
  explicit unicode_regex(std::string_view oniguruma_pattern);

  // Finds the first match at or after `start` in `text` (valid UTF-8, checked by the caller).
  // Returns false when there is none; an empty match is reported as begin == end.
  bool find(std::string_view text, std::size_t start, std::size_t& match_begin, std::size_t& match_end) const;

  // Calls on_match(begin, end) for every non-empty match, left to right, without overlap.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    std::size_t pos = 0, begin = 0, end = 0;
    while (pos <= text.size() && find(text, pos, begin, end)) {
      if (end == begin) {
        // Step over one code point, like a global JavaScript regex in unicode mode.
        if (begin >= text.size()) break;
        pos = begin + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      on_match(begin, end);
      pos = end;
    }
  }

  const std::string& pattern() const { return source_; }

 private:
  struct compiled;
  std::string source_;
  std::shared_ptr<const compiled> code_;
};

}  // namespace troupe
