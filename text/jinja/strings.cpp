#include "text/jinja/strings.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/unicode/utf8.hpp"

namespace troupe::jinja_strings {

std::vector<char32_t> decode_utf8(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; ok && k <= extra; ++k) {
      if (i + k >= text.size()) {
        ok = false;
        break;
      }
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string encode_utf8(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) utf8::append(out, cps[i]);
  return out;
}

namespace {

// Byte length of the leading run of JS whitespace, decoding only as far as needed.
std::size_t leading_space_bytes(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (!utf8::is_js_whitespace(c)) break;
      ++i;
      continue;
    }
    const std::size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (i + len > text.size()) break;
    const auto cps = decode_utf8(text.substr(i, len));
    if (cps.size() != 1 || !utf8::is_js_whitespace(cps[0])) break;
    i += len;
  }
  return i;
}

std::size_t trailing_space_start(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t begin = end - 1;
    while (begin > 0 && utf8::is_continuation_byte(static_cast<unsigned char>(text[begin])) && end - begin < 4) --begin;
    const auto cps = decode_utf8(text.substr(begin, end - begin));
    if (cps.size() != 1 || !utf8::is_js_whitespace(cps[0])) break;
    end = begin;
  }
  return end;
}

}  // namespace

std::string trim_start(std::string_view text) { return std::string(text.substr(leading_space_bytes(text))); }

std::string trim_end(std::string_view text) { return std::string(text.substr(0, trailing_space_start(text))); }

std::string trim(std::string_view text) {
  const std::size_t begin = leading_space_bytes(text);
  if (begin == text.size()) return {};
  return std::string(text.substr(begin, trailing_space_start(text) - begin));
}

std::size_t utf16_length(std::string_view text) {
  std::size_t n = 0;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (utf8::is_continuation_byte(c)) continue;
    n += (c & 0xF8) == 0xF0 ? 2 : 1;  // astral characters take a surrogate pair
  }
  return n;
}

std::string js_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";  // also -0, as in JavaScript
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+02".
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string sci(buf, ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // position of the decimal point relative to the digits
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(-n, '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += "e";
    out += (n - 1 >= 0 ? "+" : "-");
    out += std::to_string(std::abs(n - 1));
  }
  return sign + out;
}

std::string json_quote(std::string_view text, bool ensure_ascii) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  char hex[16];
  for (char32_t cp : decode_utf8(text)) {
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    if (cp < 0x20) {
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(cp));
      out += hex;
    } else if (ensure_ascii && cp >= 0x7f) {
      if (cp > 0xFFFF) {
        const char32_t v = cp - 0x10000;
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)));
        out += hex;
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
        out += hex;
      } else {
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(cp));
        out += hex;
      }
    } else {
      utf8::append(out, cp);
    }
  }
  out += '"';
  return out;
}

namespace {

// Simple (one-to-one) case mappings of the alphabets chat text mostly uses: ASCII, Latin-1,
// Latin Extended-A pairs, Greek and Cyrillic. Other characters are left as they are.
char32_t upper_of(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 0x20;
  if (c < 0x80) return c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x178 && c != 0x17F) {
    const bool odd_is_lower = (c < 0x138) || (c > 0x148 && c < 0x178);
    if (odd_is_lower ? (c % 2 == 1) : (c % 2 == 0 && c != 0x138)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  return c;
}

char32_t lower_of(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 0x20;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x178 && c != 0x17F) {
    const bool even_is_upper = (c < 0x138) || (c > 0x148 && c < 0x178);
    if (even_is_upper ? (c % 2 == 0) : (c % 2 == 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

}  // namespace

std::string to_upper(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decode_utf8(text)) {
    if (c == 0xDF) {
      out += "SS";  // what String.prototype.toUpperCase does with ß
      continue;
    }
    utf8::append(out, upper_of(c));
  }
  return out;
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decode_utf8(text)) utf8::append(out, lower_of(c));
  return out;
}

}  // namespace troupe::jinja_strings
