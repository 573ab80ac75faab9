#pragma once
// stories260K's reference greedy continuations (../shared/models/stories260K/refs.json), read in
// one place: the prompt, its ids, the ids the trained model generates and their text. Call after
// TROUPE_REQUIRE_SHARED_MODEL: a missing file throws, naming it.

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/shared_models.hpp"

namespace troupe::test {

struct stories_reference {
  std::string prompt;
  std::vector<int32_t> input_ids;      // with BOS
  std::vector<int32_t> generated_ids;  // greedy, max_new_tokens of them
  std::string completion;              // their text, as a continuation of the prompt
};

inline const std::vector<stories_reference>& stories_references() {
  static const std::vector<stories_reference> references = [] {
    const std::filesystem::path path = stories260k_dir / "refs.json";
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot open " + path.string());
    const nlohmann::json doc = nlohmann::json::parse(file);
    std::vector<stories_reference> out;
    for (const auto& r : doc.at("references")) {
      out.push_back({r.at("prompt").get<std::string>(), r.at("input_ids").get<std::vector<int32_t>>(),
                     r.at("generated_ids").get<std::vector<int32_t>>(), r.at("completion").get<std::string>()});
    }
    return out;
  }();
  return references;
}

// The reference whose prompt is `prompt` ("Zoo", "Once upon a time", "Lily wanted").
inline const stories_reference& stories_reference_for(const std::string& prompt) {
  for (const stories_reference& r : stories_references()) {
    if (r.prompt == prompt) return r;
  }
  throw std::runtime_error("refs.json has no reference for the prompt \"" + prompt + "\"");
}

}  // namespace troupe::test
