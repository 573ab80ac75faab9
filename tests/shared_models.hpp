#pragma once
// The trained test models of ../shared/models (TROUPE_SHARED_DIR at configure time), and the one
// rule for a test that needs one that is missing: on a developer's machine it is skipped, saying
// which file it wanted; in CI (the CI environment variable set, as every CI service does) it
// fails, because there a missing model is a broken setup that skipping would hide.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace troupe::test {

inline const std::filesystem::path shared_models_dir = std::filesystem::path(TROUPE_SHARED_DIR) / "models";
// stories260K in all its forms: hf/, gguf/, and refs.json with the reference continuations.
inline const std::filesystem::path stories260k_dir = shared_models_dir / "stories260K";

// CI=true (or any value but "", "0" and "false").
inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string value = ci;
  return !value.empty() && value != "0" && value != "false";
}

// "" when `path` exists; else a message naming the model, the path and what CI needs.
inline std::string missing_shared_model(const std::filesystem::path& path) {
  if (std::filesystem::exists(path)) return {};
  const auto relative = path.lexically_relative(shared_models_dir);
  const std::string model =
      relative.empty() || *relative.begin() == ".." ? path.filename().string() : relative.begin()->string();
  return model + " not found at " + path.string() +
         ": CI needs ../shared/models (TROUPE_SHARED_DIR=" + std::string(TROUPE_SHARED_DIR) + ")";
}

}  // namespace troupe::test

// Ends the test when `path` (a shared model's file or folder) is missing: a skip on a
// developer's machine, a failure in CI. Use in a test body or SetUp.
#define TROUPE_REQUIRE_SHARED_MODEL(path)                                                                         \
  do {                                                                                                            \
    if (const std::string troupe_missing = ::troupe::test::missing_shared_model(path); !troupe_missing.empty()) { \
      if (::troupe::test::running_in_ci()) FAIL() << troupe_missing;                                              \
      GTEST_SKIP() << troupe_missing << " (skipped; in CI this fails)";                                           \
    }                                                                                                             \
  } while (0)
