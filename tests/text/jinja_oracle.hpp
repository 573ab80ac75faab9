#pragma once

// Runs tests/oracles/jinja_oracle.mjs (@huggingface/jinja under node) on a batch of cases, so a
// whole suite costs one node start-up.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

struct jinja_oracle_result {
  bool ok = false;
  std::string output;  // the rendered text when ok, else the error message
};

inline std::string jinja_oracle_script() { return std::string(TROUPE_ORACLE_DIR) + "/jinja_oracle.mjs"; }

// Why the oracle cannot run here, or empty when it can.
inline std::string jinja_oracle_unavailable() {
  if (!std::filesystem::exists(std::string(TROUPE_ORACLE_DIR) + "/node_modules/@huggingface/jinja")) {
    return "npm package @huggingface/jinja is not installed in " TROUPE_ORACLE_DIR;
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not on PATH";
  return {};
}

// cases: array of {template, context}. Returns one result per case, or nullopt (with the reason in
// `error`) when node fails.
inline std::optional<std::vector<jinja_oracle_result>> run_jinja_oracle(const nlohmann::ordered_json& cases,
                                                                        std::string& error) {
  char path[] = "/tmp/troupe_jinja_cases_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    error = "mkstemp failed";
    return std::nullopt;
  }
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << cases.dump();
  }
  const std::string command = "node " + jinja_oracle_script() + " < " + path;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    std::remove(path);
    error = "popen failed";
    return std::nullopt;
  }
  std::string text;
  char buf[65536];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  const int status = pclose(pipe);
  std::remove(path);
  if (status != 0) {
    error = "node exited with status " + std::to_string(status) + ": " + text;
    return std::nullopt;
  }
  const auto parsed = nlohmann::json::parse(text);
  std::vector<jinja_oracle_result> results;
  for (const auto& r : parsed) {
    jinja_oracle_result result;
    result.ok = r.at("ok").get<bool>();
    result.output = result.ok ? r.at("output").get<std::string>() : r.at("error").get<std::string>();
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace troupe::testing
