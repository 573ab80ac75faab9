// GPU sampling with structured output's token masks: on random logits and random masks (wide,
// narrow, a single token, and masks that allow only the row's least likely tokens), the device's
// token is always allowed and is the host sampler's (engine/sampler.cpp) on the masked row:
// greedy exactly, seeded temperature / top-k / top-p draws with the same uniform(seed, offset).
// A mask that allows nothing gives -1, never a refused token. Skips without a GPU.

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "backends/cuda/ops.hpp"
#include "engine/sampler.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

enum class mask_kind { wide, narrow, single, least_likely, nothing };

// Allowed ids, sorted, for one row of `logits` [vocab].
std::vector<int32_t> make_allowed(mask_kind kind, const float* logits, int vocab, std::mt19937& rng) {
  std::vector<int32_t> ids;
  switch (kind) {
    case mask_kind::wide:
      for (int t = 0; t < vocab; ++t) {
        if (rng() % 10 != 0) ids.push_back(t);  // about 90% allowed
      }
      break;
    case mask_kind::narrow:
      for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
      break;
    case mask_kind::single: ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab))); break;
    case mask_kind::least_likely: {
      // The five lowest logits: the row's own choice is always refused, and the mask is all that decides.
      std::vector<int32_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                        [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
      ids.assign(order.begin(), order.begin() + 5);
      break;
    }
    case mask_kind::nothing: break;
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<uint64_t> bits_of(const std::vector<int32_t>& ids, int words) {
  std::vector<uint64_t> bits(static_cast<size_t>(words), 0);
  for (int32_t t : ids) bits[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t & 63);
  return bits;
}

struct row_setting {
  float temperature;
  int top_k;
  float top_p;
};

void check_masked_rows_match_the_host_sampler(int vocab, uint32_t rng_seed) {
  std::mt19937 rng(rng_seed);
  const int words = (vocab + 63) / 64;
  const std::vector<row_setting> settings{{0.0f, 0, 1.0f}, {0.8f, 0, 1.0f},  {1.0f, 5, 1.0f},
                                          {1.2f, 0, 0.9f}, {1.0f, 20, 0.7f}, {1.0f, 1, 1.0f}};
  const std::vector<mask_kind> kinds{mask_kind::wide, mask_kind::narrow, mask_kind::single, mask_kind::least_likely};
  const int seeds_per_case = 6;
  // One unmasked row after every masked case: masked and plain rows share the launch.
  const int rows = static_cast<int>(settings.size() * kinds.size()) * (seeds_per_case + 1);
  const std::vector<float> logits = random_values(static_cast<size_t>(rows) * vocab, rng, 4.0f);

  std::vector<sampling_row> params;
  std::vector<std::vector<int32_t>> allowed(static_cast<size_t>(rows));
  std::vector<uint64_t> masks;  // [num_masks, words]
  for (const row_setting& s : settings) {
    for (mask_kind kind : kinds) {
      for (int k = 0; k <= seeds_per_case; ++k) {
        const int r = static_cast<int>(params.size());
        sampling_row p{s.temperature, s.top_k, s.top_p, 1000u + static_cast<uint64_t>(r), static_cast<uint64_t>(k)};
        if (k < seeds_per_case) {
          allowed[static_cast<size_t>(r)] = make_allowed(kind, logits.data() + int64_t{r} * vocab, vocab, rng);
          p.mask_row = static_cast<int32_t>(masks.size() / static_cast<size_t>(words));
          const std::vector<uint64_t> bits = bits_of(allowed[static_cast<size_t>(r)], words);
          masks.insert(masks.end(), bits.begin(), bits.end());
        }
        params.push_back(p);
      }
    }
  }
  device_buffer logits_d = to_device(dtype::f32, logits), params_d = to_device_raw(params);
  device_buffer masks_d = to_device_raw(masks);
  device_buffer out = poisoned(static_cast<size_t>(rows) * 4);
  sample(logits_d.as<float>(), rows, vocab, params_d.as<sampling_row>(), masks_d.as<uint64_t>(), words,
         out.as<int32_t>(), nullptr);
  const std::vector<int32_t> got = from_device_raw<int32_t>(out.get(), static_cast<size_t>(rows));

  int num_sampled = 0;
  std::string differing;
  for (int r = 0; r < rows; ++r) {
    const sampling_row& p = params[static_cast<size_t>(r)];
    const std::vector<int32_t>& ids = allowed[static_cast<size_t>(r)];
    const int32_t token = got[static_cast<size_t>(r)];
    const std::span<const float> row(logits.data() + int64_t{r} * vocab, static_cast<size_t>(vocab));
    sampling_params host_params;
    host_params.temperature = p.temperature;
    host_params.top_k = p.top_k;
    host_params.top_p = p.top_p;
    host_params.seed = p.seed;
    sample_context context;
    context.request_id = r;
    context.output_index = static_cast<int32_t>(p.offset);  // the host's seeded draw: uniform(seed, output index)
    const std::vector<uint64_t> bits = p.mask_row >= 0 ? bits_of(ids, words) : std::vector<uint64_t>{};
    if (p.mask_row >= 0) {
      context.constrained = true;
      context.allowed_token_ids = ids;
      context.allowed_bits = bits;
      ASSERT_TRUE(std::binary_search(ids.begin(), ids.end(), token))
          << "row " << r << ": the device sampled refused token " << token;
    }
    sampler host(1);
    const int32_t expected = host.sample(row, host_params, context).token_id;
    if (p.temperature <= 0.0f || p.top_k == 1) {
      EXPECT_EQ(token, expected) << "greedy row " << r << " (vocab " << vocab << ")";
      continue;
    }
    ++num_sampled;
    if (token != expected) {
      differing += " row " + std::to_string(r) + ": device " + std::to_string(token) + ", host " +
                   std::to_string(expected) + ";";
    }
  }
  // Same uniform, same filters: only a draw within float rounding of a bucket or top-p edge may
  // differ (__expf against std::exp), which at this count is at most one or two rows.
  EXPECT_LE(static_cast<int>(std::count(differing.begin(), differing.end(), ';')), std::max(1, num_sampled / 50))
      << "of " << num_sampled << " seeded rows," << differing;
}

TEST(cuda_masked_sampling, the_device_picks_the_host_samplers_token_on_masked_rows) {
  TROUPE_REQUIRE_GPU();
  check_masked_rows_match_the_host_sampler(32000, 41);
  check_masked_rows_match_the_host_sampler(1003, 42);  // a vocabulary that ends inside a mask word
}

TEST(cuda_masked_sampling, a_mask_that_allows_nothing_gives_minus_one_never_a_refused_token) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(43);
  const int vocab = 4096, words = vocab / 64;
  const std::vector<float> logits = random_values(4 * static_cast<size_t>(vocab), rng, 2.0f);
  std::vector<uint64_t> masks(2 * static_cast<size_t>(words), 0);  // mask 0 allows nothing
  // Mask 1 allows token 4000 alone: the rows above must not read it (rows index their own mask).
  masks[static_cast<size_t>(words) + 4000 / 64] = uint64_t{1} << (4000 % 64);
  const std::vector<sampling_row> params{
      {0.0f, 0, 1.0f, 1, 0, 0}, {1.0f, 5, 0.9f, 2, 0, 0}, {1.0f, 0, 1.0f, 3, 0, 0}, {0.0f, 0, 1.0f, 4, 0, -1}};
  device_buffer logits_d = to_device(dtype::f32, logits), params_d = to_device_raw(params);
  device_buffer masks_d = to_device_raw(masks);
  device_buffer out = poisoned(4 * 4);
  sample(logits_d.as<float>(), 4, vocab, params_d.as<sampling_row>(), masks_d.as<uint64_t>(), words, out.as<int32_t>(),
         nullptr);
  std::vector<int32_t> got = from_device_raw<int32_t>(out.get(), 4);
  EXPECT_EQ(got[0], -1) << "greedy, nothing allowed";
  EXPECT_EQ(got[1], -1) << "top-k/top-p, nothing allowed";
  EXPECT_EQ(got[2], -1) << "temperature, nothing allowed";
  const auto last = logits.begin() + 3 * int64_t{vocab};
  EXPECT_EQ(got[3], std::max_element(last, last + vocab) - last) << "an unmasked row beside them";

  // Mask 1's only token, far from the best logit: greedy and sampled rows both take it.
  const std::vector<sampling_row> wide{{0.0f, 0, 1.0f, 1, 0, 1}, {1.0f, 5, 0.9f, 2, 0, 1}};
  device_buffer wide_d = to_device_raw(wide);
  sample(logits_d.as<float>(), 2, vocab, wide_d.as<sampling_row>(), masks_d.as<uint64_t>(), words, out.as<int32_t>(),
         nullptr);
  got = from_device_raw<int32_t>(out.get(), 2);
  EXPECT_EQ(got[0], 4000);
  EXPECT_EQ(got[1], 4000);
}

}  // namespace
}  // namespace troupe::cuda
