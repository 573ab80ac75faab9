// Speculative decoding through the synchronous engine on the trained stories260K model and on a
// random-weight one: greedy outputs (plain, with penalties, with logprobs, constrained, under a
// tight pool with chunked prefill and preemption) are the same with drafts as without, the
// drafts are really accepted on text that repeats itself, and sampled outputs follow the target
// distribution (the sampler's rejection rule exactly, the whole engine statistically).

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "backends/cpu/cpu_model.hpp"
#include "engine/guided_vocabulary.hpp"
#include "engine/llm_engine.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/sampler.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/shared_models.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_hf = test::stories260k_dir / "hf";

// ---- n-gram prompt lookup ----

TEST(ngram_proposer, copies_what_followed_the_latest_occurrence_of_the_longest_suffix) {
  ngram_proposer proposer(ngram_settings{1, 3, 4096});
  // [1 2 3] occurs at 0 (then 4) and at 5 (then 5 7): the latest one wins.
  const std::vector<int32_t> history = {1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3};
  EXPECT_EQ(proposer.lookup(history, 4), (std::vector<int32_t>{5, 7, 1, 2}));
  EXPECT_EQ(proposer.lookup(history, 1), (std::vector<int32_t>{5}));
  // Only [.. 8 3] at the end: the 3-gram and 2-gram do not recur, the 1-gram [3] does.
  const std::vector<int32_t> short_match = {1, 2, 3, 4, 9, 8, 3};
  EXPECT_EQ(proposer.lookup(short_match, 2), (std::vector<int32_t>{4, 9}));
  ngram_proposer strict(ngram_settings{2, 3, 4096});
  EXPECT_TRUE(strict.lookup(short_match, 2).empty());
  EXPECT_TRUE(proposer.lookup(std::vector<int32_t>{5, 6, 7}, 3).empty());
  EXPECT_TRUE(proposer.lookup(std::vector<int32_t>{5}, 3).empty());
}

TEST(ngram_proposer, looks_back_no_further_than_its_window) {
  std::vector<int32_t> history = {7, 8, 9};
  for (int i = 0; i < 20; ++i) history.push_back(100 + i);
  history.push_back(7);
  history.push_back(8);
  EXPECT_EQ(ngram_proposer(ngram_settings{2, 2, 100}).lookup(history, 1), (std::vector<int32_t>{9}));
  EXPECT_TRUE(ngram_proposer(ngram_settings{2, 2, 10}).lookup(history, 1).empty());
}

TEST(ngram_proposer, refuses_settings_that_cannot_work) {
  EXPECT_THROW(ngram_proposer(ngram_settings{0, 3, 100}), std::runtime_error);
  EXPECT_THROW(ngram_proposer(ngram_settings{3, 2, 100}), std::runtime_error);
  EXPECT_THROW(ngram_proposer(ngram_settings{2, 4, 4}), std::runtime_error);
}

// ---- the rejection rule ----

// The distribution sample() draws from for these logits at temperature t with top_p.
std::vector<double> target_distribution(const std::vector<float>& logits, float temperature, float top_p) {
  std::vector<double> p(logits.size());
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp((logits[i] - max_logit) / temperature);
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double mass = 0.0;
  size_t keep = 0;
  while (keep < order.size() && mass < top_p * total) mass += p[order[keep++]];
  std::vector<double> kept(p.size(), 0.0);
  for (size_t i = 0; i < keep; ++i) kept[order[i]] = p[order[i]] / mass;
  return kept;
}

// Pearson's chi-square of observed counts against expected probabilities (cells with p = 0 must
// stay empty).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int total, int& dof) {
  double x2 = 0.0;
  dof = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the target distribution";
      continue;
    }
    const double expected = p[i] * total;
    x2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++dof;
  }
  return x2;
}

// Upper 0.1 % point of chi-square with `dof` degrees of freedom (Wilson-Hilferty).
double chi_square_limit(int dof) {
  const double z = 3.09;
  const double k = dof;
  return k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
}

TEST(speculative_sampler, outputs_follow_the_target_distribution_whatever_the_draft) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.0f, 2.2f};
  sampling_params params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  const std::vector<double> p = target_distribution(logits, params.temperature, params.top_p);
  const int trials = 40000;
  // A likely draft, an unlikely one, one top-p filters out, and one outside the vocabulary.
  for (int32_t draft : {1, 6, 4, 99}) {
    sampler s(1);
    std::vector<int> counts(logits.size(), 0);
    int accepted_count = 0;
    for (int trial = 0; trial < trials; ++trial) {
      params.seed = static_cast<uint64_t>(trial);
      bool accepted = false;
      const sampled_token t = s.verify(logits, params, sample_context{1, trial % 7, {}, 0}, draft, accepted);
      ASSERT_GE(t.token_id, 0);
      ASSERT_LT(t.token_id, static_cast<int32_t>(logits.size()));
      if (accepted) {
        ASSERT_EQ(t.token_id, draft);
        ++accepted_count;
      }
      ++counts[static_cast<size_t>(t.token_id)];
    }
    int dof = 0;
    const double x2 = chi_square(counts, p, trials, dof);
    EXPECT_LT(x2, chi_square_limit(dof)) << "draft " << draft;
    // The draft is accepted exactly as often as the target would have chosen it.
    const double p_draft = static_cast<size_t>(draft) < p.size() ? p[static_cast<size_t>(draft)] : 0.0;
    EXPECT_NEAR(static_cast<double>(accepted_count) / trials, p_draft,
                4.0 * std::sqrt(p_draft * (1 - p_draft) / trials) + 1e-9)
        << "draft " << draft;
  }
}

TEST(speculative_sampler, greedy_accepts_exactly_the_argmax_and_seeded_draws_repeat) {
  const std::vector<float> logits = {0.5f, 3.0f, 1.0f};
  sampler s(3);
  sampling_params greedy;
  greedy.temperature = 0.0f;
  bool accepted = false;
  EXPECT_EQ(s.verify(logits, greedy, sample_context{}, 1, accepted).token_id, 1);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(s.verify(logits, greedy, sample_context{}, 2, accepted).token_id, 1);
  EXPECT_FALSE(accepted);
  sampling_params seeded;
  seeded.seed = 42;
  bool first = false;
  bool second = false;
  const int32_t a = s.verify(logits, seeded, sample_context{1, 5, {}, 0}, 2, first).token_id;
  const int32_t b = sampler(77).verify(logits, seeded, sample_context{1, 5, {}, 0}, 2, second).token_id;
  EXPECT_EQ(a, b);
  EXPECT_EQ(first, second);
}

// ---- the engine ----

struct engine_setup {
  int num_blocks = 512;
  int block_size = 16;
  int max_num_batched_tokens = 2048;
  load_format format = load_format::safetensors;
  dtype kv_dtype = dtype::f16;  // the KV cache's (the CPU's default)
};

// The weights the engine's model views, and the engine.
struct test_engine {
  loaded_model loaded;
  std::unique_ptr<llm_engine> engine;
  llm_engine* operator->() { return engine.get(); }
  llm_engine& operator*() { return *engine; }
};

test_engine make_engine(const engine_setup& setup, int num_speculative_tokens) {
  test_engine made;
  loaded_model& loaded = made.loaded;
  loaded = load_model(load_options{stories_hf, setup.format, dtype::f32, /*dummy_seed=*/5, false});
  engine_config config;
  config.block_size = setup.block_size;
  config.num_kv_blocks = setup.num_blocks;
  config.max_num_batched_tokens = setup.max_num_batched_tokens;
  config.max_num_seqs = 64;
  config.max_waiting_requests = 4096;
  config.num_speculative_tokens = num_speculative_tokens;
  config.max_speculative_tokens = num_speculative_tokens == 0 ? 0 : 16;  // plain: nobody speculates
  made.engine = std::make_unique<llm_engine>(
      make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{setup.num_blocks, setup.block_size}, 1,
                     setup.kv_dtype),
      config, std::vector<int32_t>{2}, /*sampler_seed=*/9);
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  made.engine->set_vocabulary(make_token_vocabulary(tok, loaded.config.vocab_size, {2}));
  return made;
}

struct run_outputs {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<float>> logprobs;
  std::map<int64_t, request_metrics> metrics;
};

run_outputs run_all(llm_engine& engine, const std::vector<std::pair<std::vector<int32_t>, sampling_params>>& requests) {
  run_outputs out;
  for (const auto& [prompt, params] : requests) {
    const add_request_result added = engine.add_request(prompt, params);
    EXPECT_TRUE(added.ok()) << added.error->message;
  }
  for (int step = 0; step < 20000 && engine.has_unfinished(); ++step) {
    for (const request_output& o : engine.step()) {
      auto& ids = out.tokens[o.request_id];
      ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
      for (const auto& lp : o.logprobs) out.logprobs[o.request_id].push_back(lp.logprob);
      if (o.finished()) out.metrics[o.request_id] = *o.metrics;
    }
  }
  EXPECT_FALSE(engine.has_unfinished());
  return out;
}

std::vector<std::pair<std::vector<int32_t>, sampling_params>> greedy_mix(const tokenizer& tok) {
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily. Once upon a time, there was a little girl named",
      "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
      "Tom and Sam went to the park. They played with a ball.",
      "One day, a big dog saw a red ball. The dog wanted the ball. The dog",
  };
  std::vector<std::pair<std::vector<int32_t>, sampling_params>> requests;
  for (size_t i = 0; i < texts.size() * 3; ++i) {
    sampling_params p;
    p.temperature = 0.0f;
    p.max_tokens = 40 + static_cast<int>(i) * 7;
    p.ignore_eos = i % 2 == 0;
    if (i % 3 == 1) p.repetition_penalty = 1.2f;
    if (i % 4 == 3) p.logprobs = 2;
    if (i == 5) p.num_speculative_tokens = 0;  // off for this one request
    if (i == 7) p.num_speculative_tokens = 7;
    requests.emplace_back(tok.encode(texts[i % texts.size()]), p);
  }
  sampling_params choice;
  choice.temperature = 0.0f;
  choice.max_tokens = 30;
  choice.guided = {guided_kind::choice, "", {"the little girl", "the little dog", "a cat"}};
  requests.emplace_back(tok.encode(texts[0]), choice);
  sampling_params regex;
  regex.temperature = 0.0f;
  regex.max_tokens = 40;
  regex.guided = {guided_kind::regex, "(ab|cd){2,9}x*", {}};
  requests.emplace_back(tok.encode(texts[1]), regex);
  return requests;
}

class speculative_engine : public ::testing::TestWithParam<engine_setup> {};

TEST_P(speculative_engine, greedy_outputs_equal_plain_decoding) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  const auto requests = greedy_mix(tok);
  auto plain_engine = make_engine(GetParam(), 0);
  const run_outputs plain = run_all(*plain_engine, requests);
  auto spec_engine = make_engine(GetParam(), 4);
  const run_outputs spec = run_all(*spec_engine, requests);

  ASSERT_EQ(plain.tokens.size(), requests.size());
  int drafts = 0;
  int accepted = 0;
  for (const auto& [id, tokens] : plain.tokens) {
    EXPECT_EQ(spec.tokens.at(id), tokens) << "request " << id;
    const auto plain_lp = plain.logprobs.find(id);
    if (plain_lp != plain.logprobs.end()) {
      const std::vector<float>& spec_lp = spec.logprobs.at(id);
      ASSERT_EQ(spec_lp.size(), plain_lp->second.size()) << "request " << id;
      // A verification step's K and V come from a larger matrix product than a plain step's, so
      // they differ in their last f32 bits; an f32 cache keeps that at 1e-4, a 16- or 8-bit cache
      // now and then rounds such a value to its neighbouring step, which stories260K's sharp
      // attention (keys up to |25|) turns into up to 3.5e-3 (measured with f16).
      const double tolerance = GetParam().kv_dtype == dtype::f32 ? 1e-4 : 1e-2;
      for (size_t i = 0; i < spec_lp.size(); ++i) EXPECT_NEAR(spec_lp[i], plain_lp->second[i], tolerance) << id;
    }
    const request_metrics& m = spec.metrics.at(id);
    EXPECT_EQ(m.num_output_tokens, plain.metrics.at(id).num_output_tokens);
    EXPECT_LE(m.num_accepted_tokens, m.num_draft_tokens);
    EXPECT_EQ(m.num_output_tokens, m.num_sampling_steps + m.num_accepted_tokens) << "request " << id;
    EXPECT_EQ(plain.metrics.at(id).num_draft_tokens, 0);
    drafts += m.num_draft_tokens;
    accepted += m.num_accepted_tokens;
  }
  EXPECT_EQ(spec.metrics.at(5).num_draft_tokens, 0) << "num_speculative_tokens 0 turns it off";
  EXPECT_GT(drafts, 0);
  if (GetParam().format == load_format::safetensors) {
    EXPECT_GT(accepted, drafts / 4) << "text that repeats itself should mostly be drafted right";
  }
  EXPECT_EQ(spec_engine->get_scheduler().num_free_blocks(), GetParam().num_blocks) << "every block back";
}

INSTANTIATE_TEST_SUITE_P(pools, speculative_engine,
                         ::testing::Values(engine_setup{512, 16, 2048, load_format::safetensors},
                                           // Chunked prefill (budget 5) and a pool too small for every request at once.
                                           engine_setup{48, 4, 5, load_format::safetensors},
                                           engine_setup{512, 16, 2048, load_format::dummy},
                                           engine_setup{512, 16, 2048, load_format::safetensors, dtype::f32},
                                           // An fp8 KV cache: drafts, their rollback, prefix-cache hits (the mix
                                           // repeats its prompts) and guided requests over 8-bit K/V.
                                           engine_setup{512, 16, 2048, load_format::safetensors, dtype::fp8_e4m3}),
                         [](const auto& info) {
                           const engine_setup& s = info.param;
                           if (s.kv_dtype != dtype::f16) return std::string(dtype_name(s.kv_dtype)) + "_kv";
                           return std::string(s.format == load_format::dummy ? "random_weights"
                                              : s.num_blocks < 100           ? "tight_pool"
                                                                             : "roomy");
                         });

// Every output position's token frequencies over many seeded requests, with and without drafts:
// a two-sample chi-square test per position (cells too rare to judge merged into one).
TEST(speculative_engine_sampling, sampled_outputs_follow_the_target_distribution) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  const std::vector<int32_t> prompt = tok.encode("The cat sat on the mat. The cat sat on the mat. The cat sat");
  const int num_requests = 1500;
  const int length = 4;
  std::vector<std::pair<std::vector<int32_t>, sampling_params>> requests;
  for (int i = 0; i < num_requests; ++i) {
    sampling_params p;
    p.temperature = 0.8f;
    p.top_k = 20;
    p.max_tokens = length;
    p.ignore_eos = true;
    p.seed = static_cast<uint64_t>(1000 + i);
    requests.emplace_back(prompt, p);
  }
  const engine_setup setup{4096, 16, 4096, load_format::safetensors};
  auto plain_engine = make_engine(setup, 0);
  const run_outputs plain = run_all(*plain_engine, requests);
  auto spec_engine = make_engine(setup, 3);
  const run_outputs spec = run_all(*spec_engine, requests);
  int accepted = 0;
  for (const auto& [id, m] : spec.metrics) accepted += m.num_accepted_tokens;
  ASSERT_GT(accepted, num_requests / 2) << "the test must exercise accepted drafts";

  for (int position = 0; position < length; ++position) {
    std::map<int32_t, std::pair<int, int>> counts;  // token -> (plain, speculative)
    for (const auto& [id, tokens] : plain.tokens) ++counts[tokens.at(position)].first;
    for (const auto& [id, tokens] : spec.tokens) ++counts[tokens.at(position)].second;
    // Two-sample chi-square on cells with at least 10 between both runs, the rest pooled.
    std::vector<std::pair<int, int>> cells;
    std::pair<int, int> rare{0, 0};
    for (const auto& [token, c] : counts) {
      if (c.first + c.second >= 10) {
        cells.push_back(c);
      } else {
        rare.first += c.first;
        rare.second += c.second;
      }
    }
    if (rare.first + rare.second > 0) cells.push_back(rare);
    if (cells.size() < 2) continue;
    double x2 = 0.0;
    for (const auto& [a, b] : cells) {
      const double expected = (a + b) / 2.0;  // equal sample sizes
      x2 += (a - expected) * (a - expected) / expected + (b - expected) * (b - expected) / expected;
    }
    EXPECT_LT(x2, chi_square_limit(static_cast<int>(cells.size()) - 1)) << "output position " << position;
  }
}

}  // namespace
}  // namespace troupe
