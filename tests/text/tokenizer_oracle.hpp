#pragma once
// Runs tests/oracles/tokenizer_oracle.mjs (node + @huggingface/tokenizers) on a corpus and returns
// its answers. Throws with a clear message when node or the oracle is missing: a test without its
// reference must fail, not pass.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

struct oracle_request {
  std::filesystem::path tokenizer_json;
  std::filesystem::path tokenizer_config;  // empty: none
  std::vector<std::string> texts;
  std::size_t prefix_decode_count = 0;
  std::vector<std::vector<std::uint8_t>> byte_strings;
};

nlohmann::json run_tokenizer_oracle(const oracle_request& request);

std::filesystem::path oracle_dir();

}  // namespace troupe::testing
