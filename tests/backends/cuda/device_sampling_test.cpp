// Sampling where the logits are: model_runner on the CUDA model hands plain steps to
// forward_sample (cuda::sample), so only token ids cross to the host. Greedy must equal the host
// sampler's choice and reproduce stories260K's references through the whole engine; seeded
// top-k/top-p draws must be reproducible and stay inside the top-k set. Skips without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/llm_engine.hpp"
#include "engine/model_runner.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

std::string stories_dir() {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  return std::string(env ? env : TROUPE_SHARED_DIR) + "/models/stories260K";
}

std::unique_ptr<model> stories_on_gpu(const loaded_model& loaded, int num_blocks) {
  cuda_options options;
  options.activation = dtype::f32;
  return make_cuda_model(loaded.config, loaded.weights, kv_cache_shape{num_blocks, 16}, options);
}

step_plan one_prefill(const std::vector<int32_t>& prompt, const sampling_params& params) {
  step_plan plan;
  scheduled_sequence s;
  s.request_id = 1;
  s.new_token_ids = prompt;
  for (int b = 0; b * 16 < static_cast<int>(prompt.size()); ++b) s.block_table.push_back(b);
  s.sample = true;
  s.params = params;
  plan.sequences.push_back(s);
  return plan;
}

TEST(device_sampling_cuda, plain_steps_sample_on_the_gpu_and_greedy_equals_the_host_sampler) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir() + "/hf");
  const loaded_model loaded = load_model(load_options{stories_dir() + "/hf"});
  auto gpu = stories_on_gpu(loaded, 8);
  model_runner on_device(*gpu, 1);
  model_runner on_host(*gpu, 1, /*device_sampling=*/false);
  sampling_params greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 5, 80};
  const step_result a = on_device.run(one_prefill(prompt, greedy));
  EXPECT_TRUE(on_device.last_run_sampled_on_device());
  const step_result b = on_host.run(one_prefill(prompt, greedy));
  EXPECT_FALSE(on_host.last_run_sampled_on_device());
  ASSERT_EQ(a.tokens.size(), 1u);
  EXPECT_EQ(a.tokens[0].token_id, b.tokens[0].token_id);

  // Logprobs need the whole row on the host.
  sampling_params with_logprobs = greedy;
  with_logprobs.logprobs = 3;
  const step_result c = on_device.run(one_prefill(prompt, with_logprobs));
  EXPECT_FALSE(on_device.last_run_sampled_on_device());
  EXPECT_EQ(c.tokens[0].token_id, a.tokens[0].token_id);
  EXPECT_EQ(c.tokens[0].top_token_ids.size(), 3u);
}

TEST(device_sampling_cuda, seeded_top_k_top_p_draws_are_reproducible_and_inside_the_top_k) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir() + "/hf");
  const loaded_model loaded = load_model(load_options{stories_dir() + "/hf"});
  auto gpu = stories_on_gpu(loaded, 8);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 5, 80};
  model_runner host(*gpu, 1, false);
  sampling_params logits_probe;
  logits_probe.temperature = 0.0f;
  logits_probe.logprobs = 5;  // the host sampler reports the 5 most likely tokens
  const step_result probe = host.run(one_prefill(prompt, logits_probe));
  const std::vector<int32_t> top5 = probe.tokens[0].top_token_ids;
  ASSERT_EQ(top5.size(), 5u);

  model_runner runner(*gpu, 1);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    sampling_params p;
    p.temperature = 1.5f;
    p.top_k = 5;
    p.top_p = 0.95f;
    p.seed = seed;
    const int32_t first = runner.run(one_prefill(prompt, p)).tokens[0].token_id;
    ASSERT_TRUE(runner.last_run_sampled_on_device());
    EXPECT_EQ(runner.run(one_prefill(prompt, p)).tokens[0].token_id, first) << "seed " << seed;
    EXPECT_NE(std::find(top5.begin(), top5.end(), first), top5.end()) << "seed " << seed << " drew " << first;
  }
}

TEST(device_sampling_cuda, the_engine_on_the_gpu_sampler_reproduces_the_references) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir() + "/refs.json");
  std::ifstream in(stories_dir() + "/refs.json");
  const auto refs = nlohmann::json::parse(in).at("references");
  const loaded_model loaded = load_model(load_options{stories_dir() + "/hf"});
  engine_config config;
  config.max_model_len = 512;
  llm_engine engine(stories_on_gpu(loaded, 128), config, std::vector<int32_t>{}, 1);
  std::map<int64_t, std::vector<int32_t>> expected, got;
  for (const auto& r : refs) {
    sampling_params p;
    p.temperature = 0.0f;
    p.ignore_eos = true;
    const auto generated = r.at("generated_ids").get<std::vector<int32_t>>();
    p.max_tokens = static_cast<int>(generated.size());
    auto added = engine.add_request(r.at("input_ids").get<std::vector<int32_t>>(), p);
    ASSERT_TRUE(added.ok()) << added.error->message;
    expected[added.request_id] = generated;
  }
  while (engine.has_unfinished()) {
    for (const auto& out : engine.step()) {
      got[out.request_id].insert(got[out.request_id].end(), out.token_ids.begin(), out.token_ids.end());
    }
  }
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace troupe
