#pragma once
// Runs tests/oracles/structured_oracle.mjs (ajv with ajv-formats, and JavaScript's RegExp) on a
// batch of constrained outputs, so a whole corpus costs one node start-up.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

struct structured_verdict {
  bool ok = false;
  std::string why;
};

// Why the oracle cannot run here, or empty when it can.
inline std::string structured_oracle_unavailable() {
  for (const char* package : {"ajv", "ajv-formats"}) {
    if (!std::filesystem::exists(std::string(TROUPE_ORACLE_DIR) + "/node_modules/" + package)) {
      return std::string("npm package ") + package + " is not installed in " TROUPE_ORACLE_DIR;
    }
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not on PATH";
  return {};
}

inline std::optional<std::vector<structured_verdict>> run_structured_oracle(const nlohmann::ordered_json& cases,
                                                                            std::string& error) {
  char path[] = "/tmp/troupe_structured_cases_XXXXXX";
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
  const std::string command = "node " TROUPE_ORACLE_DIR "/structured_oracle.mjs " + std::string(path) + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    std::remove(path);
    error = "popen failed";
    return std::nullopt;
  }
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  const int status = pclose(pipe);
  std::remove(path);
  if (status != 0) {
    error = "node exited with status " + std::to_string(status) + ": " + text;
    return std::nullopt;
  }
  std::vector<structured_verdict> verdicts;
  const nlohmann::json parsed = nlohmann::json::parse(text);
  for (const auto& r : parsed.at("results")) {
    verdicts.push_back({r.at("ok").get<bool>(), r.at("why").get<std::string>()});
  }
  return verdicts;
}

}  // namespace troupe::testing
