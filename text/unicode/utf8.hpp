#pragma once
// UTF-8 helpers shared by the tokenizer: code point access, validation, and the WHATWG decoder
// (the same replacement rules as JavaScript's TextDecoder and Rust's from_utf8_lossy), which
// decides what a dangling or broken byte sequence turns into.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::utf8 {

inline constexpr char32_t replacement_character = 0xFFFD;

// Decodes the code point starting at text[pos] and advances pos past it. The text must be valid
// UTF-8 (see is_valid / sanitize); this is the hot path and checks nothing.
inline char32_t next(std::string_view text, std::size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[pos + 1]) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(text[pos + 1]) & 0x3Fu) << 6) |
                        (static_cast<unsigned char>(text[pos + 2]) & 0x3Fu);
    pos += 3;
    return cp;
  }
  const char32_t cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(text[pos + 1]) & 0x3Fu) << 12) |
                      ((static_cast<unsigned char>(text[pos + 2]) & 0x3Fu) << 6) |
                      (static_cast<unsigned char>(text[pos + 3]) & 0x3Fu);
  pos += 4;
  return cp;
}

// Length in bytes of the sequence a valid lead byte starts.
inline std::size_t sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// A continuation byte (10xxxxxx) never starts a character.
inline bool is_continuation_byte(unsigned char byte) { return (byte & 0xC0u) == 0x80u; }

void append(std::string& out, char32_t cp);

bool is_valid(std::string_view text);

// Returns the text with every ill-formed subsequence replaced by U+FFFD (maximal-subpart rule).
std::string sanitize(std::string_view text);

// JavaScript's String.prototype.trimStart/trimEnd whitespace (WhiteSpace + LineTerminator), which
// the reference implementation uses for the lstrip/rstrip of added tokens.
bool is_js_whitespace(char32_t cp);
std::string_view trim_start_js(std::string_view text);
std::string_view trim_end_js(std::string_view text);

// Streaming WHATWG UTF-8 decoder: bytes go in one at a time, complete characters come out; an
// ill-formed byte becomes U+FFFD at once, an incomplete tail only when flush() says the run ended.
class stream_decoder {
 public:
  void push(unsigned char byte, std::string& out);
  // Ends the current byte run: an unfinished sequence becomes one U+FFFD.
  void flush(std::string& out);
  bool pending() const { return bytes_needed_ != 0; }

 private:
  void reset() {
    code_point_ = 0;
    bytes_needed_ = 0;
    bytes_seen_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
  }

  char32_t code_point_ = 0;
  int bytes_needed_ = 0;
  int bytes_seen_ = 0;
  unsigned char lower_ = 0x80;
  unsigned char upper_ = 0xBF;
};

}  // namespace troupe::utf8
