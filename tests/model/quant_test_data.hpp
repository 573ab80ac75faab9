#pragma once
// Rows of test values for the quantized formats: Gaussian rows of varied scale and centre with
// rare outliers (every code, scale and minimum gets used), and heavy-tailed rows shaped like
// trained weights (Student-t, 4 degrees of freedom), plus an importance vector shaped like a
// real imatrix (log-normal per column: a few columns matter far more than most).

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace troupe::testing {

inline std::vector<float> random_rows(int64_t rows, int64_t per_row, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * per_row));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, -3.0f + 4.0f * uniform(rng));
    const float shift = r % 3 == 0 ? row_scale * 0.7f : 0.0f;  // some rows not centred (mins matter)
    for (int64_t i = 0; i < per_row; ++i) {
      float v = normal(rng) * row_scale + shift;
      if (uniform(rng) < 0.01f) v *= 8.0f;
      values[static_cast<size_t>(r * per_row + i)] = v;
    }
  }
  return values;
}

inline std::vector<float> heavy_tailed_rows(int64_t rows, int64_t per_row, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t4(4.0f);
  std::vector<float> values(static_cast<size_t>(rows * per_row));
  for (auto& v : values) v = 0.02f * t4(rng);
  return values;
}

inline std::vector<float> importance_vector(int64_t per_row, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> importance(static_cast<size_t>(per_row));
  for (auto& v : importance) v = std::exp(normal(rng));
  return importance;
}

}  // namespace troupe::testing
