// The sampler with a token mask: whatever the logits, penalties or filters, only allowed tokens
// come out, and the wide-mask path (bits) picks what the list path picks.

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/sampler.hpp"

namespace troupe {
namespace {

struct mask {
  std::vector<int32_t> ids;
  std::vector<uint64_t> bits;
};

mask make_mask(int vocab, int every) {
  mask m;
  m.bits.assign(static_cast<size_t>((vocab + 63) / 64), 0);
  for (int t = 0; t < vocab; ++t) {
    if (t % every == 0) continue;  // refused
    m.ids.push_back(t);
    m.bits[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t & 63);
  }
  return m;
}

TEST(guided_sampler, only_allowed_tokens_come_out_with_either_path) {
  const int vocab = 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 4.f);
  std::vector<float> logits(vocab);
  for (int every : {2, 3, 50}) {  // narrow and wide masks
    const mask m = make_mask(vocab, every);
    for (int trial = 0; trial < 200; ++trial) {
      for (float& l : logits) l = normal(rng);
      logits[static_cast<size_t>(every * (trial % 10))] = 100.f;  // the best token is refused
      for (float temperature : {0.0f, 0.7f}) {
        sampling_params p;
        p.temperature = temperature;
        p.top_k = trial % 3 == 0 ? 5 : 0;
        p.top_p = trial % 2 == 0 ? 0.9f : 1.0f;
        p.repetition_penalty = trial % 4 == 0 ? 1.3f : 1.0f;
        p.seed = static_cast<uint64_t>(trial);
        std::vector<int32_t> history = {1, 2, 3, 4};
        sample_context with_list{7, trial, history, 2};
        with_list.constrained = true;
        with_list.allowed_token_ids = m.ids;
        sample_context with_bits = with_list;
        with_bits.allowed_bits = m.bits;
        sampler a(1), b(1);
        const int32_t from_list = a.sample(logits, p, with_list).token_id;
        const int32_t from_bits = b.sample(logits, p, with_bits).token_id;
        EXPECT_NE(from_list % every, 0) << "refused token " << from_list;
        EXPECT_EQ(from_list, from_bits);
        if (temperature == 0.0f && p.repetition_penalty == 1.0f) {
          int32_t best = m.ids[0];
          for (int32_t t : m.ids) best = logits[static_cast<size_t>(t)] > logits[static_cast<size_t>(best)] ? t : best;
          EXPECT_EQ(from_list, best);
        }
      }
    }
  }
}

TEST(guided_sampler, an_empty_mask_is_an_error_naming_the_request) {
  std::vector<float> logits(10, 0.f);
  sampling_params p;
  sample_context c;
  c.request_id = 42;
  c.constrained = true;
  sampler s(1);
  try {
    s.sample(logits, p, c);
    ADD_FAILURE() << "sampled from an empty mask";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("42"), std::string::npos);
  }
}

}  // namespace
}  // namespace troupe
