#pragma once
// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): cut a normalized section into the pieces the
// BPE model encodes one by one. Supported: Split, ByteLevel, Metaspace, Sequence.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

class pre_tokenizer {
 public:
  virtual ~pre_tokenizer() = default;

  // Replaces `pieces` (valid UTF-8) by their finer cut. section_index counts the sections between
  // added tokens (Metaspace's prepend_scheme "first" only prefixes section 0).
  virtual void pre_tokenize(std::vector<std::string>& pieces, std::size_t section_index) const = 0;

  // True when the pieces leave in GPT-2's byte-level alphabet (the model then maps bytes to
  // characters; the pieces themselves stay raw UTF-8).
  virtual bool is_byte_level() const { return false; }

  static std::unique_ptr<pre_tokenizer> from_json(const nlohmann::json& config);
};

}  // namespace troupe
