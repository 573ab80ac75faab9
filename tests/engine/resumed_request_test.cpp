// A resumed request (failover: another engine died mid-request) continues from the prompt plus
// the outputs already streamed, and must end exactly as the undisturbed request would have: the
// same new tokens (greedy, seeded, with penalties), the same logprobs, finish reason and usage
// counts, with only the new tokens in its deltas. Run on the trained stories260K model, whose
// outputs depend on every token before them.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_model.hpp"
#include "engine/llm_engine.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/engine/engine_test_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_dir = test::stories260k_dir;

std::vector<std::vector<int32_t>> reference_prompts() {
  std::ifstream in(stories_dir / "refs.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : doc.at("references")) prompts.push_back(r.at("input_ids").get<std::vector<int32_t>>());
  return prompts;
}

struct pool {
  int num_blocks = 64;
  int block_size = 4;
  int max_num_batched_tokens = 64;
  bool prefix_caching = true;
};

// The engine views the loaded weights' mapped files: they live as long as it does.
struct stories_engine {
  std::unique_ptr<loaded_model> loaded;  // declared first: destroyed after the engine
  std::unique_ptr<llm_engine> engine;

  llm_engine& operator*() { return *engine; }
  llm_engine* operator->() { return engine.get(); }
};

stories_engine make_engine(const pool& p) {
  stories_engine e;
  e.loaded = std::make_unique<loaded_model>(
      load_model(load_options{stories_dir / "hf", load_format::auto_detect, dtype::f32, 0, false}));
  auto m = make_cpu_model(e.loaded->config, e.loaded->weights, kv_cache_shape{p.num_blocks, p.block_size}, 1);
  engine_config config;
  config.block_size = p.block_size;
  config.num_kv_blocks = p.num_blocks;
  config.max_num_batched_tokens = p.max_num_batched_tokens;
  config.max_num_seqs = 16;
  config.enable_prefix_caching = p.prefix_caching;
  e.engine = std::make_unique<llm_engine>(std::move(m), config, std::nullopt, 1);
  return e;
}

// Everything a request's deltas said, concatenated.
struct outcome {
  std::vector<int32_t> tokens;
  std::vector<token_logprobs> logprobs;
  finish_reason finish = finish_reason::none;
  std::optional<request_metrics> metrics;
  int num_deltas_with_stop = 0;
};

using outcomes = std::map<int64_t, outcome>;

void collect(outcomes& into, const std::vector<request_output>& outputs) {
  for (const request_output& d : outputs) {
    outcome& o = into[d.request_id];
    EXPECT_EQ(o.finish, finish_reason::none) << "request " << d.request_id << " got a delta after its final";
    o.tokens.insert(o.tokens.end(), d.token_ids.begin(), d.token_ids.end());
    o.logprobs.insert(o.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (!d.stop.empty()) ++o.num_deltas_with_stop;
    if (d.finished()) {
      o.finish = d.finish;
      o.metrics = d.metrics;
    }
  }
}

void run_to_end(llm_engine& engine, outcomes& out) {
  for (int steps = 0; engine.has_unfinished() && steps < 2000; ++steps) collect(out, engine.step());
  ASSERT_FALSE(engine.has_unfinished()) << "the engine did not finish in 2000 steps";
}

outcome run_alone(llm_engine& engine, const std::vector<int32_t>& prompt, const sampling_params& params,
                  std::span<const int32_t> resumed = {}) {
  auto added = engine.add_request(prompt, params, 0, resumed);
  EXPECT_TRUE(added.ok()) << added.error->message;
  if (!added.ok()) return {};
  outcomes out;
  run_to_end(engine, out);
  return out[added.request_id];
}

// The resumed run's new outputs against the undisturbed run's outputs from index k on.
void expect_continues(const outcome& undisturbed, const outcome& resumed, size_t k, const std::string& what) {
  SCOPED_TRACE(what + ", resumed after " + std::to_string(k) + " outputs");
  const std::vector<int32_t> rest(undisturbed.tokens.begin() + static_cast<std::ptrdiff_t>(k),
                                  undisturbed.tokens.end());
  EXPECT_EQ(resumed.tokens, rest);
  EXPECT_EQ(resumed.finish, undisturbed.finish);
  ASSERT_TRUE(resumed.metrics.has_value());
  ASSERT_TRUE(undisturbed.metrics.has_value());
  EXPECT_EQ(resumed.metrics->num_prompt_tokens, undisturbed.metrics->num_prompt_tokens);
  EXPECT_EQ(resumed.metrics->num_output_tokens, undisturbed.metrics->num_output_tokens);
  EXPECT_LE(resumed.metrics->num_cached_tokens, resumed.metrics->num_prompt_tokens);
  // Times are this engine's, from the resumed arrival to its first new token.
  EXPECT_GE(resumed.metrics->ttft, 0.0);
  EXPECT_LT(resumed.metrics->ttft, 3600.0);
  EXPECT_GE(resumed.metrics->tpot, 0.0);
  ASSERT_EQ(resumed.logprobs.size(), undisturbed.logprobs.size() - (undisturbed.logprobs.empty() ? 0 : k));
  for (size_t i = 0; i < resumed.logprobs.size(); ++i) {
    const token_logprobs& got = resumed.logprobs[i];
    const token_logprobs& want = undisturbed.logprobs[k + i];
    // A prefilled position and a decoded one agree to rounding, not bit for bit.
    EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "output " << k + i;
    EXPECT_EQ(got.top_token_ids, want.top_token_ids) << "output " << k + i;
  }
}

struct sampling_case {
  const char* name;
  sampling_params params;
};

sampling_params greedy_params() {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = 24;
  p.ignore_eos = true;
  return p;
}

void PrintTo(const sampling_case& c, std::ostream* os) { *os << c.name; }

std::vector<sampling_case> sampling_cases() {
  sampling_params seeded = greedy_params();
  seeded.temperature = 0.8f;
  seeded.top_p = 0.9f;
  seeded.seed = 1234;
  sampling_params penalized = greedy_params();
  penalized.repetition_penalty = 1.3f;
  penalized.frequency_penalty = 0.6f;
  penalized.logprobs = 2;
  sampling_params seeded_penalized = seeded;
  seeded_penalized.presence_penalty = 0.8f;
  seeded_penalized.frequency_penalty = 0.4f;
  seeded_penalized.logprobs = 0;
  return {{"greedy", greedy_params()},
          {"seeded_top_p", seeded},
          {"greedy_penalties_logprobs", penalized},
          {"seeded_penalties", seeded_penalized}};
}

class resumed_request : public ::testing::TestWithParam<sampling_case> {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories_dir / "refs.json"); }
};

TEST_P(resumed_request, continues_exactly_where_the_undisturbed_run_was_and_ends_with_length) {
  const sampling_params& params = GetParam().params;
  auto engine = make_engine(pool{});
  const std::vector<int32_t> prompt = reference_prompts().at(1);
  const outcome undisturbed = run_alone(*engine, prompt, params);
  const size_t n = static_cast<size_t>(params.max_tokens);
  ASSERT_EQ(undisturbed.tokens.size(), n);
  ASSERT_EQ(undisturbed.finish, finish_reason::length);
  if (params.seed) {
    // The seed must matter, or the test could not tell a wrong output index from a right one.
    sampling_params other = params;
    other.seed = *params.seed + 1;
    EXPECT_NE(run_alone(*engine, prompt, other).tokens, undisturbed.tokens);
  }
  for (size_t k : {size_t{0}, size_t{1}, n / 2, n - 1}) {
    const std::span<const int32_t> resumed(undisturbed.tokens.data(), k);
    expect_continues(undisturbed, run_alone(*engine, prompt, params, resumed), k, GetParam().name);
  }
  EXPECT_EQ(engine->get_scheduler().num_free_blocks(), pool{}.num_blocks);
}

TEST_P(resumed_request, ends_on_the_same_stop_token) {
  sampling_params params = GetParam().params;
  params.max_tokens = 40;
  auto engine = make_engine(pool{});
  const std::vector<int32_t> prompt = reference_prompts().at(0);
  const outcome free_run = run_alone(*engine, prompt, params);
  ASSERT_EQ(free_run.tokens.size(), 40u);
  // The first output from index 6 on that did not occur before it becomes the stop token.
  size_t stop_at = 6;
  while (stop_at < free_run.tokens.size() &&
         std::find(free_run.tokens.begin(), free_run.tokens.begin() + static_cast<std::ptrdiff_t>(stop_at),
                   free_run.tokens[stop_at]) != free_run.tokens.begin() + static_cast<std::ptrdiff_t>(stop_at)) {
    ++stop_at;
  }
  ASSERT_LT(stop_at, free_run.tokens.size()) << "no fresh token to stop on";
  params.stop_token_ids = {free_run.tokens[stop_at]};
  const outcome undisturbed = run_alone(*engine, prompt, params);
  ASSERT_EQ(undisturbed.finish, finish_reason::stop);
  ASSERT_EQ(undisturbed.tokens.size(), stop_at + 1);
  for (size_t k : {size_t{0}, size_t{1}, stop_at / 2, stop_at}) {
    const std::span<const int32_t> resumed(undisturbed.tokens.data(), k);
    expect_continues(undisturbed, run_alone(*engine, prompt, params, resumed), k, GetParam().name);
  }
  EXPECT_EQ(engine->get_scheduler().num_free_blocks(), pool{}.num_blocks);
}

TEST_P(resumed_request, matches_beside_other_requests_in_a_tight_pool) {
  // Continuous batching: fresh requests are running when the resumed one arrives, the budget cuts
  // its prefill (prompt + resumed outputs) into chunks, and the pool is small enough to preempt.
  const sampling_params& params = GetParam().params;
  const pool tight{18, 4, 6, true};
  const std::vector<std::vector<int32_t>> prompts = reference_prompts();
  const size_t k = 13;

  auto reference_engine = make_engine(pool{});
  const outcome undisturbed = run_alone(*reference_engine, prompts[2], params);
  std::vector<outcome> others_alone;
  for (const auto& prompt : prompts) others_alone.push_back(run_alone(*reference_engine, prompt, params));

  auto engine = make_engine(tight);
  std::vector<int64_t> other_ids;
  outcomes out;
  for (const auto& prompt : prompts) {
    auto added = engine->add_request(prompt, params);
    ASSERT_TRUE(added.ok()) << added.error->message;
    other_ids.push_back(added.request_id);
  }
  for (int i = 0; i < 5; ++i) collect(out, engine->step());
  auto resumed = engine->add_request(prompts[2], params, 0, std::span<const int32_t>(undisturbed.tokens.data(), k));
  ASSERT_TRUE(resumed.ok()) << resumed.error->message;
  run_to_end(*engine, out);

  expect_continues(undisturbed, out[resumed.request_id], k, GetParam().name);
  int preemptions = 0;
  for (size_t i = 0; i < other_ids.size(); ++i) {
    const outcome& o = out[other_ids[i]];
    EXPECT_EQ(o.tokens, others_alone[i].tokens) << "fresh request " << i;
    if (o.metrics) preemptions += o.metrics->num_preemptions;
  }
  if (out[resumed.request_id].metrics) preemptions += out[resumed.request_id].metrics->num_preemptions;
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all four";
  EXPECT_EQ(engine->get_scheduler().num_free_blocks(), tight.num_blocks);
}

INSTANTIATE_TEST_SUITE_P(sampling, resumed_request, ::testing::ValuesIn(sampling_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// -- the scheduler alone (no model) ---------------------------------------------------------------

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::make_prompt;
using testing::test_eos;

TEST(resumed_request_scheduler, new_tokens_continue_the_output_index_and_the_first_delta_carries_the_stop_strings) {
  auto sched = create_scheduler(64, 4);
  sampling_params p = greedy(6);
  p.stop = {"The End"};
  // fake_run answers output k with 1000 + k: the resumed outputs 1000..1002 are outputs 0..2.
  const std::vector<int32_t> resumed = {1000, 1001, 1002};
  ASSERT_FALSE(sched->add_request(7, make_prompt(5), p, 0, engine_clock::now(), resumed).has_value());
  std::vector<token_delta> deltas;
  for (int steps = 0; sched->has_unfinished() && steps < 20; ++steps) {
    step_plan plan = sched->schedule();
    for (auto& d : sched->update(plan, fake_run(plan))) deltas.push_back(std::move(d));
  }
  ASSERT_EQ(deltas.size(), 3u);
  std::vector<int32_t> tokens;
  for (const auto& d : deltas) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
  EXPECT_EQ(tokens, (std::vector<int32_t>{1003, 1004, 1005}));
  // The detokenizer of a new engine has never seen the request: it needs them on the first delta.
  EXPECT_EQ(deltas[0].stop, p.stop);
  EXPECT_TRUE(deltas[1].stop.empty());
  EXPECT_EQ(deltas[2].finish, finish_reason::length);
  ASSERT_TRUE(deltas[2].metrics.has_value());
  EXPECT_EQ(deltas[2].metrics->num_prompt_tokens, 5);
  EXPECT_EQ(deltas[2].metrics->num_output_tokens, 6);
  EXPECT_EQ(sched->num_free_blocks(), 64);
}

TEST(resumed_request_scheduler, the_resumed_outputs_are_prefilled_with_the_prompt_and_hit_the_prefix_cache) {
  auto sched = create_scheduler(64, 4);
  const std::vector<int32_t> resumed = {1000, 1001, 1002, 1003, 1004};
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), greedy(8), 0, engine_clock::now(), resumed).has_value());
  step_plan first = sched->schedule();
  ASSERT_EQ(first.sequences.size(), 1u);
  std::vector<int32_t> expected_input = make_prompt(6);
  expected_input.insert(expected_input.end(), resumed.begin(), resumed.end());
  EXPECT_EQ(first.sequences[0].new_token_ids, expected_input);
  EXPECT_TRUE(first.sequences[0].sample);
  EXPECT_EQ(first.sequences[0].output_index, 5);
  sched->update(first, fake_run(first));
  // The same prompt and outputs again: the full blocks computed for request 1 are reused.
  ASSERT_FALSE(sched->add_request(2, make_prompt(6), greedy(8), 0, engine_clock::now(), resumed).has_value());
  step_plan second = sched->schedule();
  const auto it = std::find_if(second.sequences.begin(), second.sequences.end(),
                               [](const scheduled_sequence& s) { return s.request_id == 2; });
  ASSERT_NE(it, second.sequences.end());
  EXPECT_EQ(it->num_computed_tokens, 8);  // two full blocks of 4 of the 11 tokens
  ASSERT_NE(sched->find(2), nullptr);
  EXPECT_EQ(sched->find(2)->metrics().num_cached_tokens, 6);  // usage counts only the prompt's
}

TEST(resumed_request_scheduler, the_penalty_history_counts_the_resumed_tokens_as_outputs) {
  auto sched = create_scheduler(64, 4);
  sampling_params p = greedy(8);
  p.frequency_penalty = 0.5f;
  const std::vector<int32_t> resumed = {1000, 1001};
  ASSERT_FALSE(sched->add_request(1, make_prompt(3), p, 0, engine_clock::now(), resumed).has_value());
  step_plan plan = sched->schedule();
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].num_prompt_tokens, 3);
  EXPECT_EQ(plan.sequences[0].penalty_token_ids, (std::vector<int32_t>{10, 11, 12, 1000, 1001}));
}

struct refusal_case {
  const char* name;
  std::vector<int32_t> resumed;
  sampling_params params;
  const char* expected;  // a piece of the message
};

TEST(resumed_request_scheduler, refuses_resumed_outputs_of_a_request_that_cannot_still_be_running) {
  engine_config config;
  config.num_kv_blocks = 64;
  config.block_size = 4;
  config.max_model_len = 32;
  config.vocab_size = 2000;
  scheduler sched(config, {test_eos});
  sampling_params stop_on_77 = greedy(10);
  stop_on_77.stop_token_ids = {77};
  const std::vector<refusal_case> cases = {
      {"at max_tokens", {1000, 1001, 1002}, greedy(3), "3 resumed output tokens already reach max_tokens 3"},
      {"an eos", {1000, test_eos, 1001}, greedy(10, /*ignore_eos=*/false), "resumed output token 1 is 2, an eos token"},
      {"a stop id", {1000, 1001, 77}, stop_on_77, "resumed output token 2 is 77, one of stop_token_ids"},
      {"a negative id", {1000, -4}, greedy(10), "resumed output token 1 is -4, not a token id"},
      {"outside the vocabulary", {2000}, greedy(10), "resumed output token 0 is 2000, outside the vocabulary of 2000"},
      {"no room left", make_prompt(24, 100), greedy(30), "8 tokens and 24 resumed output tokens, leaving no room"},
  };
  for (const refusal_case& c : cases) {
    auto error = sched.add_request(1, make_prompt(8), c.params, 0, engine_clock::now(), c.resumed);
    ASSERT_TRUE(error.has_value()) << c.name;
    EXPECT_EQ(error->code, error_code::bad_request) << c.name;
    EXPECT_NE(error->message.find(c.expected), std::string::npos) << c.name << ": " << error->message;
    EXPECT_EQ(sched.num_waiting(), 0) << c.name;
  }
  // ignore_eos makes an eos an ordinary output, and the scheduler keeps serving.
  EXPECT_FALSE(
      sched.add_request(1, make_prompt(8), greedy(10), 0, engine_clock::now(), std::vector<int32_t>{1000, test_eos})
          .has_value());
  EXPECT_EQ(sched.num_waiting(), 1);
}

}  // namespace
}  // namespace troupe
