// The one check of sampling values both doors run: each edge case of each rule, the field it
// names, and that nothing but top_k's spelling of "off" is changed by normalizing.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "protocol/sampling_params.hpp"

namespace troupe {
namespace {

protocol_limits limits() {
  protocol_limits l;
  l.max_model_len = 512;
  return l;
}

struct validation_case {
  const char* what;
  std::function<void(sampling_params&)> change;
  const char* refused_field;  // nullptr: accepted
};

TEST(sampling_validation, each_rule_at_its_edges) {
  constexpr uint64_t int64_max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const validation_case cases[] = {
      {"defaults", [](sampling_params&) {}, nullptr},
      {"temperature 0 (greedy)", [](sampling_params& s) { s.temperature = 0; }, nullptr},
      {"temperature 100", [](sampling_params& s) { s.temperature = 100; }, nullptr},
      {"temperature -0.01", [](sampling_params& s) { s.temperature = -0.01f; }, "temperature"},
      {"temperature 100.5", [](sampling_params& s) { s.temperature = 100.5f; }, "temperature"},
      {"temperature NaN", [&](sampling_params& s) { s.temperature = nan; }, "temperature"},
      {"temperature inf", [&](sampling_params& s) { s.temperature = inf; }, "temperature"},
      {"top_k -1 (off, as vLLM)", [](sampling_params& s) { s.top_k = -1; }, nullptr},
      {"top_k 0 (off)", [](sampling_params& s) { s.top_k = 0; }, nullptr},
      {"top_k beyond any vocabulary", [](sampling_params& s) { s.top_k = 1 << 30; }, nullptr},
      {"top_k -2", [](sampling_params& s) { s.top_k = -2; }, "top_k"},
      {"top_p 0", [](sampling_params& s) { s.top_p = 0; }, "top_p"},
      {"top_p tiny", [](sampling_params& s) { s.top_p = 1e-6f; }, nullptr},
      {"top_p 1", [](sampling_params& s) { s.top_p = 1; }, nullptr},
      {"top_p 1.01", [](sampling_params& s) { s.top_p = 1.01f; }, "top_p"},
      {"top_p NaN", [&](sampling_params& s) { s.top_p = nan; }, "top_p"},
      {"min_p 0", [](sampling_params& s) { s.min_p = 0; }, nullptr},
      {"min_p 1", [](sampling_params& s) { s.min_p = 1; }, nullptr},
      {"min_p -0.1", [](sampling_params& s) { s.min_p = -0.1f; }, "min_p"},
      {"min_p 1.1", [](sampling_params& s) { s.min_p = 1.1f; }, "min_p"},
      {"repetition_penalty 0", [](sampling_params& s) { s.repetition_penalty = 0; }, "repetition_penalty"},
      {"repetition_penalty 100", [](sampling_params& s) { s.repetition_penalty = 100; }, nullptr},
      {"repetition_penalty 101", [](sampling_params& s) { s.repetition_penalty = 101; }, "repetition_penalty"},
      {"presence_penalty -2", [](sampling_params& s) { s.presence_penalty = -2; }, nullptr},
      {"presence_penalty 2.5", [](sampling_params& s) { s.presence_penalty = 2.5f; }, "presence_penalty"},
      {"frequency_penalty 2", [](sampling_params& s) { s.frequency_penalty = 2; }, nullptr},
      {"frequency_penalty -2.5", [](sampling_params& s) { s.frequency_penalty = -2.5f; }, "frequency_penalty"},
      {"seed 0", [](sampling_params& s) { s.seed = 0; }, nullptr},
      {"seed 2^63 - 1", [&](sampling_params& s) { s.seed = int64_max; }, nullptr},
      {"seed 2^63", [&](sampling_params& s) { s.seed = int64_max + 1; }, "seed"},
      {"seed -1 as a door stores it", [](sampling_params& s) { s.seed = static_cast<uint64_t>(int64_t{-1}); }, "seed"},
      {"max_tokens 1", [](sampling_params& s) { s.max_tokens = 1; }, nullptr},
      {"max_tokens the context", [](sampling_params& s) { s.max_tokens = 512; }, nullptr},
      {"max_tokens 0", [](sampling_params& s) { s.max_tokens = 0; }, "max_tokens"},
      {"max_tokens -5", [](sampling_params& s) { s.max_tokens = -5; }, "max_tokens"},
      {"max_tokens beyond the context", [](sampling_params& s) { s.max_tokens = 513; }, "max_tokens"},
      {"logprobs -1 (none)", [](sampling_params& s) { s.logprobs = -1; }, nullptr},
      {"logprobs 0", [](sampling_params& s) { s.logprobs = 0; }, nullptr},
      {"logprobs 20", [](sampling_params& s) { s.logprobs = 20; }, nullptr},
      {"logprobs 21", [](sampling_params& s) { s.logprobs = 21; }, "logprobs"},
      {"logprobs -2", [](sampling_params& s) { s.logprobs = -2; }, "logprobs"},
      {"16 stop strings of 256 bytes", [](sampling_params& s) { s.stop.assign(16, std::string(256, 'a')); }, nullptr},
      {"17 stop strings", [](sampling_params& s) { s.stop.assign(17, "a"); }, "stop"},
      {"a stop string of 257 bytes",
       [](sampling_params& s) {
         s.stop = {"a", std::string(257, 'a')};
       },
       "stop[1]"},
      {"an empty stop string",
       [](sampling_params& s) {
         s.stop = {"a", "b", ""};
       },
       "stop[2]"},
      {"64 stop ids", [](sampling_params& s) { s.stop_token_ids.assign(64, 3); }, nullptr},
      {"65 stop ids", [](sampling_params& s) { s.stop_token_ids.assign(65, 3); }, "stop_token_ids"},
      {"a negative stop id",
       [](sampling_params& s) {
         s.stop_token_ids = {3, -1};
       },
       "stop_token_ids[1]"},
  };
  for (const auto& c : cases) {
    sampling_params params;
    c.change(params);
    auto problem = validate_sampling_params(params, limits());
    if (!c.refused_field) {
      EXPECT_FALSE(problem) << c.what << " was refused: " << problem->field << ": " << problem->problem;
      continue;
    }
    ASSERT_TRUE(problem) << c.what << " was accepted";
    EXPECT_EQ(problem->field, c.refused_field) << c.what << ": " << problem->problem;
    EXPECT_FALSE(problem->problem.empty()) << c.what;
  }
}

TEST(sampling_validation, problems_say_what_was_expected_and_what_came) {
  sampling_params s;
  s.max_tokens = 600;
  auto problem = validate_sampling_params(s, limits());
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->problem, "600 exceeds this model's context of 512 tokens (prompt and output together)");
  s = {};
  s.top_p = 1.5f;
  problem = validate_sampling_params(s, limits());
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->problem, "must be in (0, 1], got 1.5");
  s = {};
  s.seed = static_cast<uint64_t>(int64_t{-7});
  problem = validate_sampling_params(s, limits());
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->problem, "must be an integer in [0, 2^63 - 1]");
}

TEST(sampling_validation, the_first_broken_rule_is_named) {
  sampling_params s;
  s.temperature = -1;
  s.max_tokens = 0;
  auto problem = validate_sampling_params(s, limits());
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->field, "temperature");
}

TEST(sampling_validation, normalizing_gives_top_k_one_spelling_of_off) {
  sampling_params s;
  s.top_k = -1;
  s.temperature = 0.7f;
  s.seed = 9;
  normalize_sampling_params(s);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_EQ(s.seed, 9u);
  s.top_k = 40;
  normalize_sampling_params(s);
  EXPECT_EQ(s.top_k, 40);
}

}  // namespace
}  // namespace troupe
