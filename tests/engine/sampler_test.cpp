#include "engine/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace troupe {
namespace {

sampling_params random_params(uint64_t seed) {
  sampling_params p;
  p.temperature = 1.0f;
  p.seed = seed;
  return p;
}

std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Token counts over `n` draws of a seeded request at output indices 0..n-1.
std::map<int32_t, int> draw(sampler& s, const std::vector<float>& logits, const sampling_params& p, int n) {
  std::map<int32_t, int> counts;
  for (int k = 0; k < n; ++k) ++counts[s.sample(logits, p, {1, k, {}, 0}).token_id];
  return counts;
}

std::set<int32_t> support(const std::map<int32_t, int>& counts) {
  std::set<int32_t> ids;
  for (auto& [id, n] : counts) ids.insert(id);
  return ids;
}

const std::vector<double> four = {0.5, 0.3, 0.15, 0.05};

TEST(sampler, greedy_takes_the_first_largest_logit) {
  sampler s(1);
  sampling_params p;
  p.temperature = 0.0f;
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 1);
  p.temperature = 0.8f;
  p.top_k = 1;  // top-1 is greedy too
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 1);
}

// The greedy scan goes several floats at a time: the maximum may sit in any lane, in the tail
// after the last whole group, or be tied across groups; NaNs are never taken.
TEST(sampler, greedy_finds_the_first_maximum_anywhere_in_a_long_row) {
  sampler s(1);
  sampling_params p;
  p.temperature = 0.0f;
  for (size_t vocab : {1u, 3u, 8u, 13u, 37u, 512u}) {
    for (size_t at = 0; at < vocab; ++at) {
      std::vector<float> logits(vocab);
      for (size_t i = 0; i < vocab; ++i) logits[i] = -static_cast<float>((i * 7) % 11);
      logits[at] = 5.0f;
      if (at + 9 < vocab) logits[at + 9] = 5.0f;  // a later tie loses
      if (at > 0) logits[at - 1] = std::nanf("");
      ASSERT_EQ(s.sample(logits, p, {}).token_id, static_cast<int32_t>(at)) << "vocab " << vocab;
    }
  }
  std::vector<float> all_nan(20, std::nanf(""));
  EXPECT_EQ(s.sample(all_nan, p, {}).token_id, 0);
}

TEST(sampler, seeded_requests_reproduce_whatever_else_is_sampled) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(300);
  for (float& l : logits) l = normal(gen);
  sampler a(11), b(99);
  sampling_params p = random_params(1234);
  std::vector<int32_t> first, second;
  for (int k = 0; k < 50; ++k) first.push_back(a.sample(logits, p, {1, k, {}, 0}).token_id);
  // Another sampler, with unseeded requests interleaved, in another order.
  sampling_params unseeded;
  for (int k = 49; k >= 0; --k) {
    b.sample(logits, unseeded, {2, k, {}, 0});
    second.push_back(b.sample(logits, p, {1, k, {}, 0}).token_id);
  }
  std::reverse(second.begin(), second.end());
  EXPECT_EQ(first, second);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 10u);  // not stuck on one value
  sampling_params other = random_params(4321);
  std::vector<int32_t> third;
  for (int k = 0; k < 50; ++k) third.push_back(a.sample(logits, other, {1, k, {}, 0}).token_id);
  EXPECT_NE(first, third);
}

TEST(sampler, plain_sampling_follows_the_distribution) {
  sampler s(5);
  auto counts = draw(s, logits_from_probs(four), random_params(7), 8000);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / 8000.0, four[i], 0.02) << "token " << i;
}

TEST(sampler, top_k_keeps_the_k_most_likely) {
  sampler s(5);
  sampling_params p = random_params(8);
  p.top_k = 2;
  auto counts = draw(s, logits_from_probs(four), p, 4000);
  EXPECT_EQ(support(counts), (std::set<int32_t>{0, 1}));
  EXPECT_NEAR(counts[0] / 4000.0, 0.5 / 0.8, 0.03);
}

TEST(sampler, top_p_keeps_the_smallest_head_reaching_p) {
  sampler s(5);
  sampling_params p = random_params(9);
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.5 + 0.3
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 3000)), (std::set<int32_t>{0, 1}));
  p.top_p = 0.85f;
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 3000)), (std::set<int32_t>{0, 1, 2}));
  p.top_p = 0.4f;
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 500)), (std::set<int32_t>{0}));
}

TEST(sampler, top_p_over_a_large_vocabulary_matches_a_full_sort) {
  const int vocab = 5000;
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(gen);
  // Reference support by full sort, as the definition reads.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  std::set<int32_t> allowed;
  double mass = 0.0;
  for (int32_t id : order) {
    if (mass >= 0.9 * z) break;
    allowed.insert(id);
    mass += std::exp(static_cast<double>(logits[id]));
  }
  ASSERT_GT(allowed.size(), 256u);  // beyond the sampler's first sorted head
  sampler s(5);
  sampling_params p = random_params(10);
  p.top_p = 0.9f;
  auto seen = support(draw(s, logits, p, 1000));
  for (int32_t id : seen) EXPECT_TRUE(allowed.count(id)) << id;
  EXPECT_GT(seen.size(), 150u);
}

TEST(sampler, min_p_drops_tokens_below_a_fraction_of_the_best) {
  sampler s(5);
  sampling_params p = random_params(11);
  p.min_p = 0.35f;  // threshold 0.175: keeps 0.5 and 0.3
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 3000)), (std::set<int32_t>{0, 1}));
  p.min_p = 0.25f;  // threshold 0.125: keeps 0.15 too
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 3000)), (std::set<int32_t>{0, 1, 2}));
}

TEST(sampler, low_temperature_concentrates_high_temperature_flattens) {
  sampler s(5);
  sampling_params p = random_params(12);
  p.temperature = 0.05f;
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 1000)), (std::set<int32_t>{0}));
  p.temperature = 1e-6f;  // no overflow at tiny temperatures
  EXPECT_EQ(support(draw(s, logits_from_probs(four), p, 100)), (std::set<int32_t>{0}));
  p.temperature = 50.0f;
  auto counts = draw(s, logits_from_probs(four), p, 4000);
  EXPECT_NEAR(counts[3] / 4000.0, 0.25, 0.04);
}

TEST(sampler, repetition_penalty_covers_prompt_and_output) {
  sampler s(5);
  sampling_params p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.2f;
  std::vector<float> logits = {2.0f, 1.9f, -1.0f, -1.1f};
  std::vector<int32_t> history = {0};
  EXPECT_EQ(s.sample(logits, p, {1, 0, history, 1}).token_id, 1);  // 2.0 / 1.2 < 1.9
  EXPECT_EQ(s.sample(logits, p, {1, 0, history, 0}).token_id, 1);  // as an output too
  // A negative logit is multiplied: -1.0 * 1.2 < -1.1.
  std::vector<float> negative = {-1.0f, -1.1f};
  EXPECT_EQ(s.sample(negative, p, {1, 0, history, 1}).token_id, 1);
  // Counted once however often it appears.
  std::vector<int32_t> twice = {0, 0};
  p.repetition_penalty = 1.04f;  // 2.0 / 1.04 = 1.923 > 1.9
  EXPECT_EQ(s.sample(logits, p, {1, 0, twice, 2}).token_id, 0);
}

TEST(sampler, logit_bias_moves_logits_before_everything_else) {
  sampler s(5);
  sampling_params p;
  p.temperature = 0.0f;
  std::vector<float> logits = {2.0f, 1.9f, -1.0f, 0.5f};
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 0);
  p.logit_bias = {{0, -100.0f}};  // banned
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 1);
  p.logit_bias = {{2, 3.5f}};  // -1 + 3.5 = 2.5
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 2);
  p.logit_bias = {{2, 3.5f}, {7, 100.0f}};  // an id past the row has no logit to move
  EXPECT_EQ(s.sample(logits, p, {}).token_id, 2);
  // Under a grammar's mask too: the bias picks among the allowed tokens.
  const std::vector<int32_t> allowed = {0, 3};
  const std::vector<uint64_t> bits = {0b1001};
  sample_context masked;
  masked.constrained = true;
  masked.allowed_token_ids = allowed;
  masked.allowed_bits = bits;
  p.logit_bias = {{3, 2.0f}};  // 0.5 + 2 = 2.5 > 2.0
  EXPECT_EQ(s.sample(logits, p, masked).token_id, 3);
  p.logit_bias = {{1, 100.0f}};  // not allowed: the mask wins
  EXPECT_EQ(s.sample(logits, p, masked).token_id, 0);
  // Sampled: a banned token never comes.
  p.temperature = 1.0f;
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}};
  p.seed = 9;
  for (int k = 0; k < 200; ++k) EXPECT_GE(s.sample(logits, p, {1, k, {}, 0}).token_id, 2);
}

TEST(sampler, presence_and_frequency_penalties_count_outputs_only) {
  sampler s(5);
  sampling_params p;
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  std::vector<float> logits = {2.0f, 1.9f};
  std::vector<int32_t> in_prompt = {0};
  EXPECT_EQ(s.sample(logits, p, {1, 0, in_prompt, 1}).token_id, 0);  // prompt: untouched
  EXPECT_EQ(s.sample(logits, p, {1, 0, in_prompt, 0}).token_id, 1);  // output: 1.5
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.06f;
  std::vector<int32_t> once = {0}, twice = {0, 0};
  EXPECT_EQ(s.sample(logits, p, {1, 0, once, 0}).token_id, 0);   // 1.94
  EXPECT_EQ(s.sample(logits, p, {1, 0, twice, 0}).token_id, 1);  // 1.88
  // A penalty must not leak into the next row.
  EXPECT_EQ(s.sample(logits, p, {1, 0, {}, 0}).token_id, 0);
}

TEST(sampler, logprobs_are_the_raw_log_softmax) {
  std::mt19937 gen(4);
  std::normal_distribution<float> normal;
  std::vector<float> logits(64);
  for (float& l : logits) l = normal(gen);
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  sampler s(5);
  sampling_params p = random_params(13);
  p.logprobs = 64;
  p.repetition_penalty = 3.0f;  // processed logits differ; reported logprobs do not
  std::vector<int32_t> history = {3, 4, 5};
  sampled_token t = s.sample(logits, p, {1, 0, history, 3});
  EXPECT_NEAR(t.logprob, logits[t.token_id] - std::log(z), 1e-4);
  ASSERT_EQ(t.top_token_ids.size(), 64u);
  double total = 0.0;
  for (size_t i = 0; i < t.top_logprobs.size(); ++i) {
    total += std::exp(t.top_logprobs[i]);
    if (i > 0) {
      EXPECT_GE(t.top_logprobs[i - 1], t.top_logprobs[i]);
    }
    EXPECT_NEAR(t.top_logprobs[i], logits[t.top_token_ids[i]] - std::log(z), 1e-4);
  }
  EXPECT_NEAR(total, 1.0, 1e-4);
  p.logprobs = 0;
  t = s.sample(logits, p, {1, 1, {}, 0});
  EXPECT_TRUE(t.top_token_ids.empty());
  EXPECT_LT(t.logprob, 0.0f);
  p.logprobs = 3;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.0f;
  t = s.sample(logits, p, {1, 2, {}, 0});
  EXPECT_EQ(t.top_token_ids[0], t.token_id);
  EXPECT_EQ(t.top_logprobs[0], t.logprob);
}

TEST(sampler, checks_parameters) {
  sampling_params p;
  EXPECT_EQ(check_sampling_params(p), std::nullopt);
  p.top_p = 1.5f;
  EXPECT_NE(check_sampling_params(p), std::nullopt);
  p = {};
  p.temperature = -1.0f;
  EXPECT_NE(check_sampling_params(p), std::nullopt);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(check_sampling_params(p), std::nullopt);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(check_sampling_params(p), std::nullopt);
  p = {};
  p.stop = {"ok", ""};
  EXPECT_EQ(check_sampling_params(p), "stop[1] is empty");
}

}  // namespace
}  // namespace troupe
