#pragma once
// Helpers for the loader tests: a scratch directory per test, and file writing.

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "tests/scratch_dir.hpp"

namespace troupe::testing {

inline std::filesystem::path shared_model_dir() {
  return std::filesystem::path(TROUPE_SHARED_DIR) / "models/stories260K";
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects `call` to throw a std::exception whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "expected an error mentioning '" << *parts.begin() << "'";
  } catch (const std::exception& e) {
    std::string message = e.what();
    for (const auto& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nmissing: " << part;
  }
}

}  // namespace troupe::testing
