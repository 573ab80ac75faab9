#pragma once
// A fresh directory per test under the build tree, removed when the test ends (also when an
// assertion fails). Any suite may use it; construct it inside a test or a fixture.

#include <filesystem>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace troupe::testing {

class scratch_dir {
 public:
  scratch_dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(TROUPE_BINARY_DIR) / "test_scratch" /
            (std::string(info->test_suite_name()) + "." + info->name() + "." + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace troupe::testing
