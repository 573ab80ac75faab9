#include "tests/text/tokenizer_oracle.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace troupe::testing {

std::filesystem::path oracle_dir() { return TROUPE_ORACLE_DIR; }

nlohmann::json run_tokenizer_oracle(const oracle_request& request) {
  const auto script = oracle_dir() / "tokenizer_oracle.mjs";
  if (!std::filesystem::exists(script)) throw std::runtime_error("oracle script missing: " + script.string());
  if (!std::filesystem::exists(oracle_dir() / "node_modules" / "@huggingface" / "tokenizers"))
    throw std::runtime_error("@huggingface/tokenizers is not installed in " + oracle_dir().string() +
                             " (run npm ci there)");

  nlohmann::json body;
  body["tokenizer"] = request.tokenizer_json.string();
  body["config"] =
      request.tokenizer_config.empty() ? nlohmann::json() : nlohmann::json(request.tokenizer_config.string());
  body["texts"] = request.texts;
  body["prefix_decode_count"] = request.prefix_decode_count;
  body["byte_strings"] = request.byte_strings;
  const auto input =
      std::filesystem::temp_directory_path() / ("troupe_tokenizer_oracle_" + std::to_string(::getpid()) + "_" +
                                                request.tokenizer_json.parent_path().filename().string() + ".json");
  {
    std::ofstream out(input, std::ios::binary);
    out << body.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  }
  // Run from the oracle folder so that node resolves its node_modules.
  const std::string command =
      "cd '" + oracle_dir().string() + "' && node tokenizer_oracle.mjs '" + input.string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot start: " + command);
  std::string output;
  char buffer[1 << 16];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  std::filesystem::remove(input);
  if (status != 0)
    throw std::runtime_error("the tokenizer oracle failed (is node installed and on PATH?). Command: " + command +
                             "\nOutput: " + output.substr(0, 2000));
  try {
    return nlohmann::json::parse(output);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("the tokenizer oracle printed no JSON: ") + e.what() +
                             "\nOutput: " + output.substr(0, 2000));
  }
}

}  // namespace troupe::testing
