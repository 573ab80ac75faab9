#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// String helpers with JavaScript semantics. The reference renderer of chat templates that Troupe
// mirrors (@huggingface/jinja) runs on JavaScript strings, so "whitespace", "length" and number
// formatting follow ECMAScript rather than C or Python.
namespace troupe::jinja_strings {

// UTF-8 -> code points. Invalid bytes decode to U+FFFD one byte at a time (never throws).
// Code points -> UTF-8 one at a time is utf8::append.
std::vector<char32_t> decode_utf8(std::string_view text);
std::string encode_utf8(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end);

// Without ECMAScript WhiteSpace + LineTerminator at either end (utf8::is_js_whitespace), as
// String.prototype.trim does; unlike utf8::trim_start_js, the text may be ill-formed UTF-8.
std::string trim(std::string_view text);
std::string trim_start(std::string_view text);
std::string trim_end(std::string_view text);

// String.prototype.length: UTF-16 code units.
std::size_t utf16_length(std::string_view text);

// Number.prototype.toString() for a double: shortest round-trip digits, exponent form outside
// [1e-7, 1e21), "NaN", "Infinity", "-Infinity".
std::string js_number(double value);

// JSON.stringify(string): quotes, escapes ", \, control characters; keeps other characters as
// they are unless ensure_ascii, which writes every code unit >= 0x7f as \uXXXX (Python-style).
std::string json_quote(std::string_view text, bool ensure_ascii);

// Case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (String.prototype.toUpperCase
// and toLowerCase there); other scripts pass through unchanged.
std::string to_upper(std::string_view text);
std::string to_lower(std::string_view text);

}  // namespace troupe::jinja_strings
