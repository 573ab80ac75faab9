#pragma once
// A deterministic corpus of varied strings for checking tokenizers against the oracle: prose,
// code, CJK, emoji sequences, whitespace runs, digits, accents (composed and decomposed), special
// tokens embedded in text, and random Unicode from blocks whose properties are the same in
// PCRE2's Unicode 14 and node's newer Unicode.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::testing {

// `specials`: added-token strings of the tokenizer under test, spliced into some texts.
std::vector<std::string> make_text_corpus(std::size_t count, std::uint32_t seed,
                                          const std::vector<std::string>& specials);

// Random byte strings, mostly near-valid UTF-8 (truncated and corrupted sequences).
std::vector<std::vector<std::uint8_t>> make_byte_corpus(std::size_t count, std::uint32_t seed);

}  // namespace troupe::testing
