#pragma once
// The post-processor of tokenizer.json ("post_processor") for a single sequence: the special ids
// around the encoded text. Supported: TemplateProcessing, ByteLevel (adds nothing),
// BertProcessing, RobertaProcessing and a Sequence of these.

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

struct post_processor {
  std::vector<std::int32_t> prefix;  // before the text, e.g. BOS
  std::vector<std::int32_t> suffix;  // after it

  using token_lookup = std::function<std::optional<std::int32_t>(std::string_view)>;
  static post_processor from_json(const nlohmann::json& config, const token_lookup& lookup);
};

}  // namespace troupe
