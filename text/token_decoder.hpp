#pragma once
// The decoder of tokenizer.json ("decoder"), built so that it streams: ids go in one at a time and
// every piece of text comes out as soon as nothing later can change it. Full decoding is the same
// machine run to the end, so streamed text always concatenates to the decoded text.
//
// Supported: ByteLevel; Metaspace; Sequence of Replace / Strip (per token), ByteFallback, Fuse and
// a final Strip; no decoder (tokens joined by spaces, as the reference does). Then, when
// tokenizer_config asks for it, clean_up_tokenization_spaces (" ." -> "." and friends).

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/unicode/utf8.hpp"

namespace troupe {

class token_decoder {
 public:
  token_decoder() = default;
  token_decoder(const nlohmann::json& decoder, bool clean_up_tokenization_spaces);

  // What one decoding run remembers between tokens.
  struct state {
    utf8::stream_decoder bytes;  // the current run of raw bytes
    std::size_t strip_left = 0;  // leading strip characters still to drop
    bool strip_left_done = false;
    std::string held_trailing;    // possible trailing strip characters, held back
    std::string cleanup_pending;  // text the clean-up rules could still change
    bool first_token = true;
    bool raw = false;  // a continuation: no whole-text strip, no clean-up
  };

  // continuation: the text continues one already decoded (a prompt): its first token keeps its
  // leading space, and neither the whole-text Strip nor clean-up applies, so the text is exactly
  // the tokens' bytes (token_bytes) one after another.
  state start(bool continuation = false) const;
  // Appends to `out` the text that token (its vocabulary string; is_added for added tokens) makes
  // final.
  void push(state& s, std::string_view token, bool is_added, std::string& out) const;
  // Ends the run: a dangling byte sequence becomes U+FFFD, held-back text is released.
  void finish(state& s, std::string& out) const;

  // The bytes one token adds to a continuation's text (above): Metaspace and SentencePiece
  // pieces with their spaces, a byte-fallback or byte-level token as its raw byte(s), which may
  // be part of a UTF-8 sequence only.
  std::string token_bytes(std::string_view token, bool is_added) const;

 private:
  enum class kind { byte_level, pieces, join_with_space };

  void push_text(state& s, std::string_view text, std::string& out) const;
  void after_strip(state& s, std::string_view text, std::string& out) const;
  void emit(state& s, std::string_view text, std::string& out) const;

  kind kind_ = kind::join_with_space;
  std::vector<std::pair<std::string, std::string>> replacements_;  // per token, in order
  std::string token_strip_content_;                                // per-token Strip (before Fuse)
  std::size_t token_strip_start_ = 0, token_strip_stop_ = 0;
  bool metaspace_ = false;  // Metaspace: the first token loses one leading space
  bool byte_fallback_ = false;
  std::string strip_content_;  // Strip of the whole text (after Fuse)
  std::size_t strip_start_ = 0, strip_stop_ = 0;
  bool clean_up_ = false;
};

// The reference's clean_up_tokenization: " ." -> ".", " n't" -> "n't", ... in its order.
std::string clean_up_tokenization(std::string text);

}  // namespace troupe
