// The RoPE inverse frequencies every backend uses, against the Llama 3 formula in double.

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "model/rope_frequencies.hpp"

namespace troupe {
namespace {

TEST(rope_frequencies, follow_llama3_scaling) {
  model_config config;
  config.head_dim = 128;
  config.rope_theta = 500000.0f;
  auto plain = rope_inv_freq(config);
  config.rope_scaling = rope_scaling_config{8.0f, 1.0f, 4.0f, 8192};
  auto scaled = rope_inv_freq(config);
  ASSERT_EQ(scaled.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128.0);
    ASSERT_NEAR(plain[i], base, 1e-6 * base);
    const double wavelen = 2 * std::numbers::pi / base;
    double want = base;
    if (wavelen > 8192.0) {
      want = base / 8.0;  // slower than the original context: interpolated by the factor
    } else if (wavelen >= 8192.0 / 4.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * base / 8.0 + smooth * base;
    }
    ASSERT_NEAR(scaled[i], want, 1e-5 * want) << i;
  }
  EXPECT_EQ(scaled[0], plain[0]);                   // high frequencies untouched
  EXPECT_NEAR(scaled[63], plain[63] / 8.0f, 1e-12);  // the lowest divided by the factor
}

TEST(rope_frequencies, an_odd_head_dim_is_refused) {
  model_config config;
  config.head_dim = 7;
  EXPECT_THROW(rope_inv_freq(config), std::runtime_error);
}

}  // namespace
}  // namespace troupe
