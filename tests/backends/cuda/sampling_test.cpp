// GPU sampling: greedy equals a host argmax; random draws stay inside the top-k / top-p set,
// repeat for the same seed, and follow the filtered distribution.

#include <algorithm>
#include <numeric>

#include "backends/cuda/ops.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

TEST(cuda_sampling, argmax_matches_the_host_and_prefers_the_first_tie) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(31);
  const int rows = 5, vocab = 151936;
  std::vector<float> logits = random_values(rows * vocab, rng, 3.0f);
  logits[2 * vocab + 7] = logits[2 * vocab + 9000] = 100.0f;  // tie: index 7 wins
  device_buffer logits_d = to_device(dtype::f32, logits);
  device_buffer out = poisoned(rows * 4);
  argmax(logits_d.as<float>(), rows, vocab, out.as<int32_t>(), nullptr);
  const std::vector<int32_t> got = from_device_raw<int32_t>(out.get(), rows);
  for (int r = 0; r < rows; ++r) {
    const auto row = logits.begin() + int64_t{r} * vocab;
    EXPECT_EQ(got[r], std::max_element(row, row + vocab) - row) << r;
  }
  EXPECT_EQ(got[2], 7);
}

// The host's view of the kept set: top_k largest, then the smallest prefix reaching top_p.
std::vector<double> filtered_distribution(const std::vector<float>& logits, const sampling_row& p) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> prob(vocab, 0.0);
  const double best = logits[order[0]];
  double total = 0.0;
  const int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  for (int i = 0; i < k; ++i) total += prob[order[i]] = std::exp((logits[order[i]] - best) / p.temperature);
  double running = 0.0;
  for (int i = 0; i < k; ++i) {
    if (running >= p.top_p * total) prob[order[i]] = 0.0;
    running += std::exp((logits[order[i]] - best) / p.temperature);
  }
  for (int i = k; i < vocab; ++i) prob[order[i]] = 0.0;
  const double kept = std::accumulate(prob.begin(), prob.end(), 0.0);
  for (double& x : prob) x /= kept;
  return prob;
}

TEST(cuda_sampling, draws_follow_the_filtered_distribution) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(32);
  const int vocab = 50, draws = 4000;
  const std::vector<float> row = random_values(vocab, rng, 1.5f);
  struct setting {
    float temperature;
    int top_k;
    float top_p;
  };
  for (setting s : {setting{1.0f, 0, 1.0f}, setting{0.7f, 10, 1.0f}, setting{1.3f, 0, 0.8f}, setting{1.0f, 20, 0.5f}}) {
    std::vector<float> logits;
    std::vector<sampling_row> params(draws);
    for (int i = 0; i < draws; ++i) {
      logits.insert(logits.end(), row.begin(), row.end());
      params[i] = sampling_row{s.temperature, s.top_k, s.top_p, 1234, static_cast<uint64_t>(i)};
    }
    device_buffer logits_d = to_device(dtype::f32, logits), params_d = to_device_raw(params);
    device_buffer out = poisoned(draws * 4);
    sample(logits_d.as<float>(), draws, vocab, params_d.as<sampling_row>(), out.as<int32_t>(), nullptr);
    const std::vector<int32_t> got = from_device_raw<int32_t>(out.get(), draws);
    const std::vector<double> expected = filtered_distribution(row, params[0]);
    std::vector<int> counts(vocab, 0);
    for (int32_t token : got) {
      ASSERT_GE(token, 0);
      ASSERT_LT(token, vocab);
      ASSERT_GT(expected[token], 0.0) << "token " << token << " is outside the top-k/top-p set";
      ++counts[token];
    }
    // Total variation distance of 4000 draws from the filtered distribution.
    double distance = 0.0;
    for (int t = 0; t < vocab; ++t) distance += std::abs(counts[t] / double{draws} - expected[t]);
    EXPECT_LT(distance / 2, 0.05) << "temperature " << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p;

    // Same seed and offset: the same token again.
    device_buffer again = poisoned(draws * 4);
    sample(logits_d.as<float>(), draws, vocab, params_d.as<sampling_row>(), again.as<int32_t>(), nullptr);
    EXPECT_EQ(from_device_raw<int32_t>(again.get(), draws), got);
  }
}

TEST(cuda_sampling, greedy_rows_and_top_k_one_are_argmax) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(33);
  const int rows = 4, vocab = 32000;
  const std::vector<float> logits = random_values(rows * vocab, rng, 2.0f);
  const std::vector<sampling_row> params{
      {0.0f, 0, 1.0f, 1, 0}, {1.0f, 1, 1.0f, 2, 0}, {0.0f, 5, 0.5f, 3, 0}, {1.0f, 1, 0.9f, 4, 9}};
  device_buffer logits_d = to_device(dtype::f32, logits), params_d = to_device_raw(params);
  device_buffer out = poisoned(rows * 4);
  sample(logits_d.as<float>(), rows, vocab, params_d.as<sampling_row>(), out.as<int32_t>(), nullptr);
  const std::vector<int32_t> got = from_device_raw<int32_t>(out.get(), rows);
  for (int r = 0; r < rows; ++r) {
    const auto row = logits.begin() + int64_t{r} * vocab;
    EXPECT_EQ(got[r], std::max_element(row, row + vocab) - row) << r;
  }
}

TEST(cuda_sampling, uniform_is_a_pure_function_of_seed_and_offset) {
  EXPECT_EQ(sampling_uniform(7, 3), sampling_uniform(7, 3));
  EXPECT_NE(sampling_uniform(7, 3), sampling_uniform(7, 4));
  EXPECT_NE(sampling_uniform(7, 3), sampling_uniform(8, 3));
  double sum = 0.0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = sampling_uniform(99, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

}  // namespace
}  // namespace troupe::cuda
