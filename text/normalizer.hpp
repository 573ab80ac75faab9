#pragma once
// Normalizers of tokenizer.json ("normalizer"): text -> text before pre-tokenization. Supported:
// NFC, Prepend, Replace (String or Regex pattern), Strip, Sequence.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace troupe {

class normalizer {
 public:
  virtual ~normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;

  // Returns nullptr for a null config; throws std::runtime_error for an unknown type.
  static std::unique_ptr<normalizer> from_json(const nlohmann::json& config);
};

// Replaces every occurrence of a literal string (no regex needed: the common case is " " -> "▁").
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

}  // namespace troupe
