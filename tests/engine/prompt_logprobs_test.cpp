// prompt_logprobs on the real stories260K model: a greedy continuation's decode-time logprobs
// (one token at a time, attention over the cache) equal the prompt logprobs of the same text fed
// back as a prompt (every row of chunked prefills), position by position. The prompt request runs
// with prefix caching on and the text already cached, in chunks smaller than a block, so a skipped
// position or a chunk's last row judged against the wrong token would show.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_model.hpp"
#include "engine/llm_engine.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_dir = std::filesystem::path(TROUPE_SHARED_DIR) / "models" / "stories260K";

std::vector<int32_t> first_reference_prompt() {
  std::ifstream in(stories_dir / "refs.json");
  return nlohmann::json::parse(in).at("references").at(0).at("input_ids").get<std::vector<int32_t>>();
}

// The model's weights outlive the engine that reads them.
const loaded_model& stories() {
  static const loaded_model loaded =
      load_model(load_options{stories_dir / "hf", load_format::auto_detect, dtype::f32, 0, false});
  return loaded;
}

std::unique_ptr<llm_engine> make_engine(int max_num_batched_tokens, bool prefix_caching) {
  const loaded_model& loaded = stories();
  engine_config config;
  config.block_size = 16;
  config.num_kv_blocks = 64;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = 8;
  config.enable_prefix_caching = prefix_caching;
  auto m = make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{config.num_kv_blocks, config.block_size}, 1);
  return std::make_unique<llm_engine>(std::move(m), config, std::nullopt, 1);
}

// Runs the engine until `id` finishes; its deltas in order.
std::vector<token_delta> run_to_end(llm_engine& engine, int64_t id) {
  std::vector<token_delta> deltas;
  bool done = false;
  for (int steps = 0; !done && steps < 10000; ++steps) {
    for (token_delta& d : engine.step()) {
      if (d.request_id != id) continue;
      done = done || d.finished();
      deltas.push_back(std::move(d));
    }
  }
  EXPECT_TRUE(done) << "request " << id << " did not finish";
  return deltas;
}

TEST(prompt_logprobs, equal_a_greedy_continuations_decode_logprobs_through_chunks_and_a_warm_prefix_cache) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir / "refs.json");
  const std::vector<int32_t> prompt = first_reference_prompt();
  constexpr int top_n = 3;

  // The continuation, decoded one token at a time.
  auto decoder = make_engine(256, false);
  sampling_params greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 40;
  greedy.ignore_eos = true;
  greedy.logprobs = top_n;
  const int64_t decoded_id = decoder->add_request(prompt, greedy).request_id;
  std::vector<int32_t> outputs;
  std::vector<token_logprobs> decoded;
  for (const token_delta& d : run_to_end(*decoder, decoded_id)) {
    outputs.insert(outputs.end(), d.token_ids.begin(), d.token_ids.end());
    decoded.insert(decoded.end(), d.logprobs.begin(), d.logprobs.end());
    EXPECT_TRUE(d.prompt_logprobs.empty()) << "not asked for";
  }
  ASSERT_EQ(outputs.size(), 40u);
  ASSERT_EQ(decoded.size(), outputs.size());

  // The whole text as a prompt, in 5-token chunks, on an engine whose prefix cache holds it.
  std::vector<int32_t> text = prompt;
  text.insert(text.end(), outputs.begin(), outputs.end());
  auto prefiller = make_engine(5, true);
  sampling_params plain;
  plain.temperature = 0.0f;
  plain.max_tokens = 1;
  run_to_end(*prefiller, prefiller->add_request(text, plain).request_id);
  // The cache does hit for a request that does not ask (so the next one's full answer is the
  // refusal of the hit, not a cold cache).
  const std::vector<token_delta> warm = run_to_end(*prefiller, prefiller->add_request(text, plain).request_id);
  ASSERT_TRUE(warm.back().metrics);
  EXPECT_GT(warm.back().metrics->num_cached_tokens, 0);

  sampling_params asking = plain;
  asking.prompt_logprobs = top_n;
  const std::vector<token_delta> deltas = run_to_end(*prefiller, prefiller->add_request(text, asking).request_id);
  ASSERT_FALSE(deltas.empty());
  ASSERT_TRUE(deltas.back().metrics);
  EXPECT_EQ(deltas.back().metrics->num_cached_tokens, 0) << "a prompt_logprobs request must not reuse cached positions";
  std::vector<prompt_token_logprob> got;
  int num_carrying = 0;
  for (const token_delta& d : deltas) {
    if (!d.prompt_logprobs.empty()) ++num_carrying;
    got.insert(got.end(), d.prompt_logprobs.begin(), d.prompt_logprobs.end());
  }
  EXPECT_EQ(num_carrying, 1) << "they come once, with the first token";
  ASSERT_EQ(got.size(), text.size() - 1);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token_id, text[i + 1]) << "position " << i + 1;
    EXPECT_GE(got[i].rank, 1);
    ASSERT_EQ(got[i].top_token_ids.size(), static_cast<size_t>(top_n));
    ASSERT_EQ(got[i].top_logprobs.size(), static_cast<size_t>(top_n));
    EXPECT_LE(got[i].logprob, got[i].top_logprobs[0] + 1e-6f);
  }
  // The generated positions: token, logprob and alternatives as decoding saw them.
  for (size_t k = 0; k < outputs.size(); ++k) {
    const prompt_token_logprob& p = got[prompt.size() - 1 + k];
    SCOPED_TRACE("output " + std::to_string(k));
    EXPECT_EQ(p.token_id, outputs[k]);
    EXPECT_NEAR(p.logprob, decoded[k].logprob, 1e-4f);
    EXPECT_EQ(p.rank, 1) << "greedy: the most likely token";
    EXPECT_EQ(p.top_token_ids[0], outputs[k]);
    for (int j = 0; j < top_n; ++j) EXPECT_NEAR(p.top_logprobs[j], decoded[k].top_logprobs[j], 1e-4f);
  }
}

TEST(prompt_logprobs, a_one_token_prompt_has_none_and_a_request_without_them_gets_none) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir / "refs.json");
  auto engine = make_engine(64, true);
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = 3;
  p.prompt_logprobs = 0;
  const std::vector<token_delta> deltas = run_to_end(*engine, engine->add_request({1}, p).request_id);
  for (const token_delta& d : deltas) EXPECT_TRUE(d.prompt_logprobs.empty());
  p.prompt_logprobs = 0;
  const std::vector<token_delta> two = run_to_end(*engine, engine->add_request({1, 403}, p).request_id);
  ASSERT_FALSE(two.empty());
  ASSERT_EQ(two.front().prompt_logprobs.size(), 1u);
  EXPECT_EQ(two.front().prompt_logprobs[0].token_id, 403);
  EXPECT_TRUE(two.front().prompt_logprobs[0].top_token_ids.empty()) << "0 alternatives asked";
}

}  // namespace
}  // namespace troupe
