#include "engine/step_time_model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace troupe {
namespace {

step_shape shape(double tokens, double seqs, double pairs) { return step_shape{tokens, seqs, pairs}; }

double linear(const step_time_model::coefficients& b, const step_shape& s) {
  return b[0] + b[1] * s.num_tokens + b[2] * s.num_sequences + b[3] * s.attention_pairs;
}

// Steps of varied shapes: decodes of a few sequences, prefill chunks, mixes.
std::vector<step_shape> varied_shapes(int n) {
  std::vector<step_shape> shapes;
  for (int i = 0; i < n; ++i) {
    step_shape s;
    const int num_decodes = 1 + i % 7;
    for (int d = 0; d < num_decodes; ++d) s.add(1, 50 + 37 * ((i + d) % 11));
    if (i % 3 == 0) s.add(16 + 29 * (i % 13), 64 * (i % 5));
    shapes.push_back(s);
  }
  return shapes;
}

TEST(step_time_model, predicts_from_the_prior_until_steps_are_seen) {
  const step_time_model::coefficients prior{1e-3, 1e-5, 2e-4, 0};
  step_time_model model(prior);
  const step_shape s = shape(100, 4, 1000);
  EXPECT_DOUBLE_EQ(model.predict(s), linear(prior, s));
  EXPECT_EQ(model.num_observed(), 0u);
  EXPECT_EQ(model.rms_error(), 0);
}

TEST(step_time_model, shape_counts_tokens_sequences_and_attention_pairs) {
  step_outline step;
  step.sequences.push_back({1, 99, 1, true, 0});    // a decode over 100 tokens
  step.sequences.push_back({2, 32, 16, false, 0});  // a chunk of 16 after 32
  const step_shape s = shape_of(step);
  EXPECT_EQ(s.num_tokens, 17);
  EXPECT_EQ(s.num_sequences, 2);
  EXPECT_EQ(s.attention_pairs, 1 * 100 + 16 * 48);
}

TEST(step_time_model, recovers_the_coefficients_of_measured_steps) {
  // The truth differs from the prior in every coefficient.
  const step_time_model::coefficients truth{3e-3, 2e-5, 5e-4, 3e-8};
  step_time_model model;
  for (const step_shape& s : varied_shapes(300)) model.observe(s, linear(truth, s));
  for (size_t j = 0; j < step_time_model::num_features; ++j) {
    EXPECT_NEAR(model.fitted()[j], truth[j], 0.05 * truth[j]) << "coefficient " << j;
  }
  const step_shape unseen = shape(700, 9, 250000);
  EXPECT_NEAR(model.predict(unseen), linear(truth, unseen), 0.03 * linear(truth, unseen));
  EXPECT_LT(model.rms_error(), 1e-4);
}

TEST(step_time_model, keeps_the_prior_for_a_feature_never_seen_and_fits_the_rest) {
  // Decodes only: no attention pairs beyond a constant context, tokens == sequences. Prediction
  // of such steps must still be right.
  const step_time_model::coefficients truth{4e-3, 1e-4, 1e-4, 0};
  step_time_model model;
  for (int i = 0; i < 200; ++i) {
    step_shape s;
    for (int d = 0; d < 1 + i % 9; ++d) s.add(1, 0);
    model.observe(s, linear(truth, s));
  }
  step_shape eight;
  for (int d = 0; d < 8; ++d) eight.add(1, 0);
  EXPECT_NEAR(model.predict(eight), linear(truth, eight), 0.02 * linear(truth, eight));
}

TEST(step_time_model, memory_is_bounded_and_the_fit_follows_a_change) {
  const step_time_model::coefficients slow{8e-3, 8e-5, 0, 0};
  const step_time_model::coefficients fast{1e-3, 1e-5, 0, 0};
  step_time_model model(step_time_model::default_prior, /*capacity=*/64);
  const auto shapes = varied_shapes(400);
  for (int i = 0; i < 200; ++i) model.observe(shapes[i], linear(slow, shapes[i]));
  for (int i = 200; i < 400; ++i) model.observe(shapes[i], linear(fast, shapes[i]));
  EXPECT_EQ(model.num_samples(), 64u);
  EXPECT_EQ(model.num_observed(), 400u);
  // The slow steps are forgotten: a recent shape is predicted at the fast rate (slow is 8x).
  for (int i : {399, 398, 397}) {
    EXPECT_NEAR(model.predict(shapes[i]), linear(fast, shapes[i]), 0.05 * linear(fast, shapes[i])) << "step " << i;
  }
}

TEST(step_time_model, ignores_times_that_are_not_durations) {
  step_time_model model;
  model.observe(shape(10, 1, 10), 0);
  model.observe(shape(10, 1, 10), -1);
  model.observe(shape(10, 1, 10), std::numeric_limits<double>::quiet_NaN());
  model.observe(shape(10, 1, 10), std::numeric_limits<double>::infinity());
  EXPECT_EQ(model.num_observed(), 0u);
  EXPECT_EQ(model.fitted(), step_time_model::default_prior);
}

}  // namespace
}  // namespace troupe
