// Structured output end to end through the synchronous engine: a corpus of 210 JSON schemas,
// regexes and choices, each constraining a completion of stories260K and of a random-weight
// model (where the constraint alone must make the output valid), every output judged by
// independent engines (ajv, JavaScript's RegExp). Sampled and greedy rows, max_tokens from
// barely enough to plenty, all requests batched through one engine per model.

#include <gtest/gtest.h>

#include <map>

#include "backends/cpu/cpu_model.hpp"
#include "engine/guided_vocabulary.hpp"
#include "engine/llm_engine.hpp"
#include "grammar/guided_grammar.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/engine/constrained_cases.hpp"
#include "tests/engine/structured_oracle.hpp"
#include "tests/shared_models.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_hf = test::stories260k_dir / "hf";

using testing::constrained_case;

std::vector<constrained_case> build_cases(int num_schemas, int max_len) {
  testing::constrained_corpus corpus;
  corpus.schema_seed = 2024;
  corpus.slack_seed = 11;
  corpus.num_schemas = num_schemas;
  corpus.max_slack = 200;  // from no slack at all (the length rule decides every token) to plenty
  corpus.patterns = {"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
                     "\\d{3}-\\d{4}",
                     "(yes|no|maybe)!?",
                     "[a-z]+@[a-z]+\\.(com|org)",
                     "-?\\d+(\\.\\d{1,2})?",
                     "(ab|cd){2,5}x*",
                     "[^\\n\"]{5,20}",
                     "#[0-9a-f]{6}",
                     "\\w+ \\w+",
                     "(0|[1-9][0-9]*)(,(0|[1-9][0-9]*))*"};
  corpus.choices = {{"positive", "negative", "neutral"},
                    {"Paris", "London", "Rome", "Tōkyō"},
                    {"A", "B", "C", "D", "none of the above"}};
  corpus.any_json_object = true;
  return testing::build_constrained_cases(corpus, max_len, [](sampling_params& p, int index) {
    p.temperature = index % 4 == 0 ? 0.0f : 1.0f;
    p.seed = static_cast<uint64_t>(index);
  });
}

class structured_output : public ::testing::TestWithParam<load_format> {};

TEST_P(structured_output, every_output_of_the_corpus_validates) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  if (const auto why = testing::structured_oracle_unavailable(); !why.empty()) GTEST_SKIP() << why;
  loaded_model loaded = load_model(load_options{stories_hf, GetParam(), dtype::f32, /*dummy_seed=*/5, false});
  const int block_size = 16;
  const int num_blocks = 4096;
  engine_config config;
  config.block_size = block_size;
  config.num_kv_blocks = num_blocks;
  config.max_num_seqs = 128;
  config.max_num_batched_tokens = 2048;
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  llm_engine engine(make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{num_blocks, block_size}, 1), config,
                    std::vector<int32_t>{2}, /*sampler_seed=*/9);
  engine.set_vocabulary(make_token_vocabulary(tok, loaded.config.vocab_size, {2}));

  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a little");
  const int max_len = loaded.config.max_position_embeddings - static_cast<int>(prompt.size()) - 1;
  std::vector<constrained_case> cases = build_cases(210, max_len);
  ASSERT_GE(cases.size(), 200u + 14u) << "the corpus must hold at least 200 schemas";
  std::map<int64_t, size_t> case_of;
  for (size_t i = 0; i < cases.size(); ++i) {
    const add_request_result added = engine.add_request(prompt, cases[i].params);
    ASSERT_TRUE(added.ok()) << added.error->message << "\n" << cases[i].oracle_case.dump();
    case_of[added.request_id] = i;
  }
  std::map<int64_t, std::vector<int32_t>> outputs;
  std::map<int64_t, finish_reason> finishes;
  for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) {
    for (const request_output& out : engine.step()) {
      auto& ids = outputs[out.request_id];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
      if (out.finished()) finishes[out.request_id] = out.finish;
    }
  }
  ASSERT_FALSE(engine.has_unfinished());

  nlohmann::ordered_json batch = nlohmann::ordered_json::array();
  for (const auto& [id, index] : case_of) {
    std::vector<int32_t> ids = outputs[id];
    if (!ids.empty() && ids.back() == 2) ids.pop_back();  // the EOS that ended it
    // The length rule keeps the last token for EOS: a constrained output always stops, never runs out.
    EXPECT_EQ(finishes[id], finish_reason::stop) << cases[index].oracle_case.dump();
    nlohmann::ordered_json c = cases[index].oracle_case;
    c["output"] = tok.decode(ids, /*skip_special_tokens=*/true);
    batch.push_back(c);
    if (std::getenv("TROUPE_SHOW_OUTPUTS")) std::printf("%s\n", c["output"].get<std::string>().c_str());
  }
  std::string error;
  const auto verdicts = testing::run_structured_oracle(batch, error);
  ASSERT_TRUE(verdicts) << error;
  ASSERT_EQ(verdicts->size(), batch.size());
  int num_valid = 0;
  for (size_t i = 0; i < verdicts->size(); ++i) {
    EXPECT_TRUE((*verdicts)[i].ok) << (*verdicts)[i].why << "\n  case: " << batch[i].dump();
    num_valid += (*verdicts)[i].ok;
  }
  EXPECT_EQ(num_valid, static_cast<int>(batch.size()));
}

INSTANTIATE_TEST_SUITE_P(models, structured_output, ::testing::Values(load_format::safetensors, load_format::dummy),
                         [](const auto& info) {
                           return std::string(info.param == load_format::dummy ? "random_weights" : "stories260K");
                         });

TEST(structured_output_engine, refuses_a_constraint_it_cannot_compile_or_serve) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  loaded_model loaded = load_model(load_options{stories_hf, load_format::dummy, dtype::f32, 1, false});
  engine_config config;
  config.block_size = 16;
  config.num_kv_blocks = 64;
  llm_engine engine(make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{64, 16}, 1), config,
                    std::vector<int32_t>{2});
  sampling_params p;
  p.max_tokens = 50;
  p.guided = {guided_kind::regex, "[a-z]+", {}};
  auto without_vocabulary = engine.add_request({1, 5, 6}, p);
  ASSERT_FALSE(without_vocabulary.ok());
  EXPECT_NE(without_vocabulary.error->message.find("vocabulary"), std::string::npos);
  engine.set_vocabulary(make_token_vocabulary(tokenizer::from_directory(stories_hf), loaded.config.vocab_size, {2}));
  p.guided = {guided_kind::regex, "(?=a)", {}};
  auto bad = engine.add_request({1, 5, 6}, p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error->message.find("guided_regex"), std::string::npos) << bad.error->message;
  p.guided = {guided_kind::regex, "[a-z]+", {}};
  EXPECT_TRUE(engine.add_request({1, 5, 6}, p).ok());
}

// A request resumed elsewhere (failover, disaggregation) arrives with outputs: the worker's
// matcher replays them, so the continuation completes the grammar instead of starting it over.
TEST(structured_output_engine, a_resumed_request_continues_its_grammar_where_it_was) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  loaded_model loaded = load_model(load_options{stories_hf, load_format::dummy, dtype::f32, 3, false});
  engine_config config;
  config.block_size = 16;
  config.num_kv_blocks = 64;
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  llm_engine engine(make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{64, 16}, 1), config,
                    std::vector<int32_t>{2}, 4);
  engine.set_vocabulary(make_token_vocabulary(tok, loaded.config.vocab_size, {2}));
  for (uint64_t seed = 0; seed < 8; ++seed) {
    sampling_params p;
    p.max_tokens = 12;
    p.seed = seed;
    p.guided = {guided_kind::regex, "abc[0-9]", {}};
    const std::vector<int32_t> resumed = {3 + 'a', 3 + 'b', 3 + 'c'};  // the byte-fallback tokens <0x61>...
    const add_request_result added = engine.add_request({1, 400, 401}, p, 0, resumed);
    ASSERT_TRUE(added.ok()) << added.error->message;
    std::vector<int32_t> ids = resumed;
    for (int step = 0; step < 100 && engine.has_unfinished(); ++step) {
      for (const request_output& out : engine.step()) ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    }
    ASSERT_EQ(ids.back(), 2) << "ended by EOS";
    ids.pop_back();
    const std::string text = tok.decode(ids, true);
    EXPECT_TRUE(byte_dfa::compile("abc[0-9]").matches(text)) << text;
  }
}

}  // namespace
}  // namespace troupe
