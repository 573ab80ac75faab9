#include "engine/step_time_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe {
namespace {

step_shape shape(double tokens, double seqs, double context, double pairs) {
  return step_shape{tokens, seqs, context, pairs};
}

// The cost the tests state, written out rather than through step_cost::predict.
struct truth {
  double step = 0, token = 0, sequence = 0, context_token = 0, pair = 0, floor = 1;
  double operator()(const step_shape& s) const {
    return step + token * std::max(s.num_tokens, floor) + sequence * s.num_sequences +
           context_token * s.context_tokens + pair * s.attention_pairs;
  }
};

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
  const step_cost prior{{1e-3, 1e-5, 2e-4, 1e-7, 0}, 1};
  step_time_model model(prior);
  const step_shape s = shape(100, 4, 500, 1000);
  EXPECT_DOUBLE_EQ(model.predict(s), (truth{1e-3, 1e-5, 2e-4, 1e-7, 0, 1}(s)));
  EXPECT_EQ(model.num_observed(), 0u);
  EXPECT_EQ(model.rms_error(), 0);
}

TEST(step_time_model, shape_counts_tokens_sequences_context_and_attention_pairs) {
  step_outline step;
  step.sequences.push_back({1, 99, 1, true, 0});    // a decode over 100 tokens
  step.sequences.push_back({2, 32, 16, false, 0});  // a chunk of 16 after 32
  const step_shape s = shape_of(step);
  EXPECT_EQ(s.num_tokens, 17);
  EXPECT_EQ(s.num_sequences, 2);
  EXPECT_EQ(s.context_tokens, 100 + 48);
  EXPECT_EQ(s.attention_pairs, 1 * 100 + 16 * 48);
}

TEST(step_time_model, the_token_floor_bounds_small_steps_from_below) {
  const step_cost cost{{1e-3, 1e-4, 0, 0, 0}, 8};
  EXPECT_DOUBLE_EQ(cost.predict(shape(1, 1, 1, 1)), 1e-3 + 8e-4);
  EXPECT_DOUBLE_EQ(cost.predict(shape(8, 8, 8, 8)), 1e-3 + 8e-4);
  EXPECT_DOUBLE_EQ(cost.predict(shape(100, 1, 100, 100)), 1e-3 + 1e-2);
  EXPECT_EQ(step_cost::feature_name(3), "context_token");
}

TEST(step_time_model, recovers_the_coefficients_of_measured_steps) {
  // The truth differs from the prior in every coefficient.
  const truth t{3e-3, 2e-5, 5e-4, 4e-7, 3e-8, 1};
  step_time_model model;
  for (const step_shape& s : varied_shapes(300)) model.observe(s, t(s));
  const double expected[] = {t.step, t.token, t.sequence, t.context_token, t.pair};
  for (size_t j = 0; j < step_cost::num_features; ++j) {
    EXPECT_NEAR(model.fitted().seconds[j], expected[j], 0.05 * expected[j]) << "coefficient " << j;
  }
  EXPECT_EQ(model.fitted().token_floor, 1);
  step_shape unseen;
  for (int d = 0; d < 9; ++d) unseen.add(1, 300);
  unseen.add(600, 400);
  EXPECT_NEAR(model.predict(unseen), t(unseen), 0.03 * t(unseen));
  EXPECT_LT(model.rms_error(), 1e-4);
}

TEST(step_time_model, finds_the_floor_below_which_a_step_costs_its_weights_read) {
  // Decodes of 1-16 sequences cost as much as 8 tokens until they have more (a 3 ms weights read,
  // then 0.3 ms a token); prompt chunks of 64-512 tokens the tokens' arithmetic. One line through
  // both ends would put a large constant under every decode.
  const truth t{2e-4, 3e-4, 5e-5, 2e-6, 1e-9, 8};
  step_time_model model;
  std::vector<step_shape> shapes;
  for (int i = 0; i < 240; ++i) {
    step_shape s;
    for (int d = 0; d < 1 + i % 16; ++d) s.add(1, 40 + 13 * ((i + d) % 17));
    if (i % 4 == 0) s.add(64 << (i % 4 + (i / 4) % 4), 0);
    model.observe(s, t(s));
  }
  EXPECT_EQ(model.fitted().token_floor, 8);
  for (int decodes : {1, 3, 8, 12}) {
    step_shape s;
    for (int d = 0; d < decodes; ++d) s.add(1, 120);
    EXPECT_NEAR(model.predict(s), t(s), 0.03 * t(s)) << decodes << " decodes";
  }
  step_shape prompt;
  prompt.add(256, 0);
  EXPECT_NEAR(model.predict(prompt), t(prompt), 0.03 * t(prompt));
}

TEST(step_time_model, keeps_the_prior_for_a_feature_never_seen_and_fits_the_rest) {
  // Decodes only: no attention pairs beyond a constant context, tokens == sequences. Prediction
  // of such steps must still be right.
  const truth t{4e-3, 1e-4, 1e-4, 0, 0, 1};
  step_time_model model;
  for (int i = 0; i < 200; ++i) {
    step_shape s;
    for (int d = 0; d < 1 + i % 9; ++d) s.add(1, 0);
    model.observe(s, t(s));
  }
  step_shape eight;
  for (int d = 0; d < 8; ++d) eight.add(1, 0);
  EXPECT_NEAR(model.predict(eight), t(eight), 0.02 * t(eight));
}

TEST(step_time_model, memory_is_bounded_and_the_fit_follows_a_change) {
  const truth slow{8e-3, 8e-5, 0, 0, 0, 1};
  const truth fast{1e-3, 1e-5, 0, 0, 0, 1};
  step_time_model model(step_time_model::default_prior, /*capacity=*/64);
  const auto shapes = varied_shapes(520);
  for (int i = 0; i < 200; ++i) model.observe(shapes[i], slow(shapes[i]));
  for (int i = 200; i < 520; ++i) model.observe(shapes[i], fast(shapes[i]));
  EXPECT_EQ(model.num_samples(), 64u);
  EXPECT_EQ(model.num_observed(), 520u);
  // The slow steps are forgotten (none stays past four capacities): a recent shape is predicted
  // at the fast rate (slow is 8x).
  for (int i : {519, 518, 517}) {
    EXPECT_NEAR(model.predict(shapes[i]), fast(shapes[i]), 0.05 * fast(shapes[i])) << "step " << i;
  }
}

TEST(step_time_model, a_run_of_large_steps_does_not_push_the_small_ones_out) {
  // An overloaded server steps at its largest batches for minutes; a plan made from its fit
  // still meets small steps. The small steps stay held while they are the rarer size.
  const truth t{2e-4, 3e-4, 5e-5, 0, 0, 8};
  step_time_model model(step_time_model::default_prior, /*capacity=*/64);
  for (int i = 0; i < 40; ++i) {
    step_shape s;
    for (int d = 0; d < 1 + i % 4; ++d) s.add(1, 40 + 13 * ((i + d) % 17));
    model.observe(s, t(s));
  }
  for (int i = 0; i < 200; ++i) {
    step_shape s;
    for (int d = 0; d < 16; ++d) s.add(1, 40 + 13 * ((i + d) % 17));
    s.add(256 + 16 * (i % 16), 32 * (i % 5));
    model.observe(s, t(s));
  }
  EXPECT_EQ(model.num_samples(), 64u);
  step_shape one;
  one.add(1, 100);
  EXPECT_NEAR(model.predict(one), t(one), 0.05 * t(one));
}

TEST(step_time_model, a_prompt_token_s_cost_is_told_once_enough_steps_are_measured) {
  const truth t{2e-3, 1e-4, 0, 0, 0, 1};
  step_time_model model;
  const auto shapes = varied_shapes(40);
  for (int i = 0; i < 31; ++i) model.observe(shapes[i], t(shapes[i]));
  EXPECT_EQ(model.seconds_per_prompt_token(), 0) << "31 steps: the prior's, not this machine's";
  model.observe(shapes[31], t(shapes[31]));
  step_shape chunk;
  chunk.add(256, 0);
  EXPECT_NEAR(model.seconds_per_prompt_token(), t(chunk) / 256, 0.02 * t(chunk) / 256);
}

TEST(step_time_model, no_step_is_predicted_faster_than_the_fastest_measured) {
  // Decodes of one shape only: the fit leaves every other direction to the prior and the
  // noise; whatever it says of a step far from them, the prediction is no less than the
  // fastest step held.
  step_time_model model;
  for (int i = 0; i < 12; ++i) {
    step_shape s;
    for (int d = 0; d < 4; ++d) s.add(1, 100 + i);
    model.observe(s, 1e-3 * (1 + 0.1 * (i % 3)));
  }
  EXPECT_DOUBLE_EQ(model.fitted().min_seconds, 1e-3);
  step_shape tiny;
  tiny.add(5, 0);
  EXPECT_GE(model.predict(tiny), 1e-3);
  const step_cost negative{{-1e-3, 0, 0, 0, 0}, 1, 2e-4};
  EXPECT_DOUBLE_EQ(negative.predict(tiny), 2e-4);
}

// Steps that grow faster with more sequences (a machine whose serving stack's share of the cores
// falls as batches grow) would read as a negative cost per sequence: the fit holds every cost at
// zero or more, and says the constant instead.
TEST(step_time_model, no_cost_is_negative_even_where_the_steps_suggest_it) {
  step_time_model model;
  double mean = 0;
  for (int i = 0; i < 200; ++i) {
    const int num_seqs = 1 + i % 16;
    step_shape s;
    for (int d = 0; d < num_seqs; ++d) s.add(1, 100);
    const double seconds = 4e-3 - 1e-4 * num_seqs;
    model.observe(s, seconds);
    mean += seconds / 200;
  }
  for (size_t j = 0; j < step_cost::num_features; ++j) {
    EXPECT_GE(model.fitted().seconds[j], 0.0) << step_cost::feature_name(j);
  }
  step_shape one;
  one.add(1, 100);
  EXPECT_NEAR(model.predict(one), mean, 0.5e-3);
  // Where the truth has no negative cost the constraint changes nothing: exact steps of a
  // positive truth with one cost at zero are fitted exactly.
  const truth exact{1e-3, 2e-5, 0, 3e-8, 1e-9, 1};
  step_time_model positive;
  for (const step_shape& v : varied_shapes(300)) positive.observe(v, exact(v));
  for (const step_shape& v : varied_shapes(40)) EXPECT_NEAR(positive.predict(v), exact(v), 1e-3 * exact(v));
}

TEST(step_time_model, ignores_times_that_are_not_durations) {
  step_time_model model;
  model.observe(shape(10, 1, 10, 10), 0);
  model.observe(shape(10, 1, 10, 10), -1);
  model.observe(shape(10, 1, 10, 10), std::numeric_limits<double>::quiet_NaN());
  model.observe(shape(10, 1, 10, 10), std::numeric_limits<double>::infinity());
  EXPECT_EQ(model.num_observed(), 0u);
  EXPECT_EQ(model.fitted().seconds, step_time_model::default_prior.seconds);
  EXPECT_EQ(model.fitted().token_floor, step_time_model::default_prior.token_floor);
}

}  // namespace
}  // namespace troupe
