#pragma once
// GPT-2's byte-level alphabet: every byte maps to one printable code point, so a byte-level BPE
// vocabulary is written in those characters (space is "Ġ", newline "Ċ").

#include <array>
#include <string>

namespace troupe::byte_level {

// UTF-8 of the character that stands for each byte.
const std::array<std::string, 256>& byte_to_utf8();

// The byte a character stands for, or -1 when the character is not in the alphabet.
int char_to_byte(char32_t cp);

}  // namespace troupe::byte_level
