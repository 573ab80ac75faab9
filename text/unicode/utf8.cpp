#include "text/unicode/utf8.hpp"

namespace troupe::utf8 {

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void stream_decoder::push(unsigned char byte, std::string& out) {
  if (bytes_needed_ == 0) {
    if (byte < 0x80) {
      out.push_back(static_cast<char>(byte));
    } else if (byte >= 0xC2 && byte <= 0xDF) {
      bytes_needed_ = 1;
      code_point_ = byte & 0x1F;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      if (byte == 0xE0) lower_ = 0xA0;  // overlong
      if (byte == 0xED) upper_ = 0x9F;  // surrogates
      bytes_needed_ = 2;
      code_point_ = byte & 0x0F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      if (byte == 0xF0) lower_ = 0x90;  // overlong
      if (byte == 0xF4) upper_ = 0x8F;  // beyond U+10FFFF
      bytes_needed_ = 3;
      code_point_ = byte & 0x07;
    } else {
      append(out, replacement_character);
    }
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // The sequence so far is a maximal subpart: one U+FFFD, then the byte starts afresh.
    reset();
    append(out, replacement_character);
    push(byte, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  code_point_ = (code_point_ << 6) | (byte & 0x3F);
  if (++bytes_seen_ == bytes_needed_) {
    append(out, code_point_);
    reset();
  }
}

void stream_decoder::flush(std::string& out) {
  if (bytes_needed_ != 0) {
    reset();
    append(out, replacement_character);
  }
}

bool is_valid(std::string_view text) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    int needed;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      needed = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      needed = 2;
      if (b0 == 0xE0) lower = 0xA0;
      if (b0 == 0xED) upper = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      needed = 3;
      if (b0 == 0xF0) lower = 0x90;
      if (b0 == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    if (i + needed >= n) return false;  // truncated at the end
    for (int k = 1; k <= needed; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (b < lower || b > upper) return false;
      lower = 0x80;
      upper = 0xBF;
    }
    i += needed + 1;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  stream_decoder decoder;
  for (char c : text) decoder.push(static_cast<unsigned char>(c), out);
  decoder.flush(out);
  return out;
}

bool is_js_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view trim_start_js(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t next_pos = pos;
    if (!is_js_whitespace(next(text, next_pos))) break;
    pos = next_pos;
  }
  return text.substr(pos);
}

std::string_view trim_end_js(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && is_continuation_byte(static_cast<unsigned char>(text[start]))) --start;
    std::size_t pos = start;
    if (!is_js_whitespace(next(text, pos))) break;
    end = start;
  }
  return text.substr(0, end);
}

}  // namespace troupe::utf8
