// The RoPE inverse frequencies every backend uses, against the Llama 3 formula in double.

#include <gtest/gtest.h>

#include <algorithm>
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
  config.rope_scaling = llama3_rope_scaling(8.0f, 1.0f, 4.0f, 8192);
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
  EXPECT_EQ(scaled[0], plain[0]);                    // high frequencies untouched
  EXPECT_NEAR(scaled[63], plain[63] / 8.0f, 1e-12);  // the lowest divided by the factor
}

model_config scaled(rope_scaling_type type, float factor) {
  model_config config;
  config.head_dim = 64;
  config.rope_theta = 10000.0f;
  config.max_position_embeddings = 8192;
  rope_scaling_config s;
  s.type = type;
  s.factor = factor;
  s.original_max_position_embeddings = 2048;
  config.rope_scaling = s;
  return config;
}

double plain(int i, int dims, double theta = 10000.0) { return std::pow(theta, -2.0 * i / dims); }

TEST(rope_frequencies, linear_divides_every_frequency) {
  const rope_parameters rope = rope_for_layer(scaled(rope_scaling_type::linear, 4.0f), 0);
  ASSERT_EQ(rope.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(rope.inv_freq[i], plain(i, 64) / 4, 1e-6 * plain(i, 64)) << i;
  EXPECT_EQ(rope.attention_factor, 1.0f);
}

TEST(rope_frequencies, dynamic_ntk_grows_the_base_for_factor_times_the_context) {
  const rope_parameters rope = rope_for_layer(scaled(rope_scaling_type::dynamic, 4.0f), 0);
  const double base = 10000.0 * std::pow(4.0 * 4.0 - 3.0, 64.0 / 62.0);  // vLLM's static form
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(rope.inv_freq[i], plain(i, 64, base), 1e-5 * plain(i, 64, base)) << i;
  EXPECT_EQ(rope.inv_freq[0], 1.0f);  // the highest frequency never moves
}

// transformers' _compute_yarn_parameters, written out in double.
std::vector<double> yarn(double factor, bool truncate, int dims, double theta, double original) {
  auto correction = [&](double rotations) {
    return dims * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = correction(32), high = correction(1);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dims - 1.0);
  std::vector<double> inv_freq;
  for (int i = 0; i < dims / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv_freq.push_back(plain(i, dims, theta) / factor * ramp + plain(i, dims, theta) * (1 - ramp));
  }
  return inv_freq;
}

TEST(rope_frequencies, yarn_ramps_between_the_correction_dimensions_and_scales_attention) {
  model_config config = scaled(rope_scaling_type::yarn, 8.0f);
  for (bool truncate : {true, false}) {
    config.rope_scaling->truncate = truncate;
    const rope_parameters rope = rope_for_layer(config, 0);
    const std::vector<double> want = yarn(8.0, truncate, 64, 10000.0, 2048.0);
    for (int i = 0; i < 32; ++i)
      EXPECT_NEAR(rope.inv_freq[i], want[i], 1e-5 * want[i]) << i << (truncate ? " truncated" : "");
    EXPECT_NEAR(rope.attention_factor, 0.1 * std::log(8.0) + 1, 1e-6);
  }
  EXPECT_EQ(rope_for_layer(config, 0).inv_freq[0], 1.0f);                        // fast dimensions extrapolate
  EXPECT_NEAR(rope_for_layer(config, 0).inv_freq[31], plain(31, 64) / 8, 1e-9);  // slow ones interpolate
  config.rope_scaling->mscale = 1.0f;  // DeepSeek's form: mscale / mscale_all_dim
  config.rope_scaling->mscale_all_dim = 0.5f;
  EXPECT_NEAR(rope_for_layer(config, 0).attention_factor, (0.1 * std::log(8.0) + 1) / (0.05 * std::log(8.0) + 1), 1e-6);
  config.rope_scaling->attention_factor = 1.25f;  // given outright
  EXPECT_EQ(rope_for_layer(config, 0).attention_factor, 1.25f);
}

TEST(rope_frequencies, longrope_takes_long_factors_beyond_the_original_context) {
  model_config config = scaled(rope_scaling_type::longrope, 1.0f);
  for (int i = 0; i < 32; ++i) {
    config.rope_scaling->short_factor.push_back(1.0f + 0.01f * i);
    config.rope_scaling->long_factor.push_back(2.0f + i);
  }
  config.rope_scaling->attention_factor = longrope_attention_factor(8192, 2048);
  EXPECT_NEAR(config.rope_scaling->attention_factor, std::sqrt(1 + std::log(4.0) / std::log(2048.0)), 1e-6);
  rope_parameters rope = rope_for_layer(config, 0);  // serves 8192 > 2048: long
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(rope.inv_freq[i], plain(i, 64) / (2.0 + i), 1e-6 * plain(i, 64)) << i;
  EXPECT_EQ(rope.attention_factor, config.rope_scaling->attention_factor);
  config.max_position_embeddings = 2048;  // a served context within the original: short
  rope = rope_for_layer(config, 0);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(rope.inv_freq[i], plain(i, 64) / (1.0 + 0.01 * i), 1e-6 * plain(i, 64)) << i;
  config.rope_scaling->short_factor.pop_back();
  EXPECT_THROW(rope_for_layer(config, 0), std::runtime_error);
  EXPECT_EQ(longrope_attention_factor(2048, 2048), 1.0f);
}

TEST(rope_frequencies, partial_rotary_and_gemma3_local_layers) {
  model_config config;
  config.head_dim = 64;
  config.rotary_dim = 48;  // Phi-4-mini: 3/4 of each head
  config.rope_theta = 1000000.0f;
  EXPECT_EQ(rope_for_layer(config, 0).inv_freq.size(), 24u);
  EXPECT_NEAR(rope_for_layer(config, 0).inv_freq[1], plain(1, 48, 1e6), 1e-6 * plain(1, 48, 1e6));
  config.rotary_dim = 0;
  config.rope_local_theta = 10000.0f;
  config.sliding_layers = {true, false};
  config.rope_scaling = llama3_rope_scaling(8.0f, 1.0f, 4.0f, 64);
  EXPECT_NEAR(rope_for_layer(config, 0).inv_freq[5], plain(5, 64), 1e-6 * plain(5, 64));  // local: own base, unscaled
  EXPECT_EQ(rope_for_layer(config, 1).inv_freq, rope_inv_freq(config));                   // global
  EXPECT_NE(rope_for_layer(config, 1).inv_freq[5], rope_for_layer(config, 0).inv_freq[5]);
}

TEST(rope_frequencies, an_odd_head_dim_is_refused) {
  model_config config;
  config.head_dim = 7;
  EXPECT_THROW(rope_inv_freq(config), std::runtime_error);
}

}  // namespace
}  // namespace troupe
