#pragma once
// Unicode Normalization Form C (canonical decomposition, canonical ordering, canonical
// composition), which Qwen's tokenizer.json asks for before pre-tokenization.

#include <string>
#include <string_view>

namespace troupe {

// Input must be valid UTF-8. Text below U+0300 is returned as is without table lookups.
std::string nfc_normalize(std::string_view text);

}  // namespace troupe
