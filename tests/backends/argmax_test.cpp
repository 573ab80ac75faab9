// argmax (backends/cpu/argmax.*) against the plain loop it replaces, on rows whose lengths leave every
// possible remainder past the vector width, with ties, infinities and NaNs placed anywhere.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/argmax.hpp"
#include "backends/cpu/simd_level.hpp"

namespace troupe {
namespace {

int32_t reference_argmax(const std::vector<float>& v) {
  float best = -std::numeric_limits<float>::infinity();
  for (float x : v) best = x > best ? x : best;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

// Runs the body at every SIMD level this CPU supports (the SSE2 path at `scalar`).
class argmax_at_level : public ::testing::TestWithParam<cpu::simd_level> {
 protected:
  void SetUp() override {
    if (!cpu::simd_level_supported(GetParam())) GTEST_SKIP() << "this CPU lacks " << cpu::simd_level_name(GetParam());
    cpu::force_simd_level(GetParam());
  }
  void TearDown() override { cpu::clear_forced_simd_level(); }
};

TEST_P(argmax_at_level, matches_the_first_maximum_of_the_plain_loop) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int n = 1; n <= 70; ++n) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> row(static_cast<size_t>(n));
      // Few distinct values make ties for the maximum common.
      for (float& x : row) x = trial % 2 == 0 ? value(rng) : std::round(value(rng));
      std::uniform_int_distribution<int> at(0, n - 1);
      if (trial % 5 == 1) row[at(rng)] = nan;
      if (trial % 7 == 2) row[at(rng)] = -inf;
      if (trial % 11 == 3) row[at(rng)] = inf;
      ASSERT_EQ(argmax(row), reference_argmax(row)) << "n " << n << " trial " << trial;
    }
  }
}

TEST_P(argmax_at_level, a_row_of_nans_gives_zero_and_minus_infinity_is_found) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(std::vector<float>(37, nan)), 0);
  std::vector<float> row(37, nan);
  row[29] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(argmax(row), 29);
  EXPECT_EQ(argmax(std::vector<float>(512, 1.5f)), 0);
}

INSTANTIATE_TEST_SUITE_P(levels, argmax_at_level,
                         ::testing::Values(cpu::simd_level::scalar, cpu::simd_level::avx2, cpu::simd_level::avx512),
                         [](const auto& info) { return std::string(cpu::simd_level_name(info.param)); });

}  // namespace
}  // namespace troupe
