// Structured output through the CUDA backend with device sampling on: the constrained rows'
// token masks go to the GPU with the step, the matcher follows the device's tokens, and every
// output of the schema / regex / choice corpus validates (ajv and JavaScript's RegExp, as in
// tests/engine/structured_output_test.cpp). Greedy rows equal the CPU backend's token for token.
// Skips without a GPU.

#include <gtest/gtest.h>

#include <map>

#include "backends/cpu/cpu_model.hpp"
#include "engine/guided_vocabulary.hpp"
#include "engine/llm_engine.hpp"
#include "grammar/guided_grammar.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/engine/constrained_cases.hpp"
#include "tests/engine/structured_oracle.hpp"
#include "tests/shared_models.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

const std::filesystem::path stories_hf = test::stories260k_dir / "hf";

// The CUDA model, counting the rows it sampled on the device with a token mask.
class counting_model : public model {
 public:
  explicit counting_model(std::unique_ptr<model> inner) : inner_(std::move(inner)) {}
  const model_config& config() const override { return inner_->config(); }
  kv_cache_shape kv_shape() const override { return inner_->kv_shape(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  void forward(const forward_batch& batch, float* logits) override { inner_->forward(batch, logits); }
  bool can_sample_on_device() const override { return inner_->can_sample_on_device(); }
  void forward_sample(const forward_batch& batch, std::span<const device_sampling_row> rows, int32_t* tokens) override {
    for (const device_sampling_row& row : rows) num_masked_rows += row.allowed_bits.empty() ? 0 : 1;
    inner_->forward_sample(batch, rows, tokens);
  }
  int num_masked_rows = 0;

 private:
  std::unique_ptr<model> inner_;
};

using testing::constrained_case;

std::vector<constrained_case> build_cases(int num_schemas, int max_len) {
  testing::constrained_corpus corpus;
  corpus.schema_seed = 2025;
  corpus.slack_seed = 17;
  corpus.num_schemas = num_schemas;
  corpus.max_slack = 150;
  corpus.patterns = {"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?", "\\d{3}-\\d{4}", "[a-z]+@[a-z]+\\.(com|org)",
                     "-?\\d+(\\.\\d{1,2})?", "#[0-9a-f]{6}"};
  corpus.choices = {{"positive", "negative", "neutral"}};
  return testing::build_constrained_cases(corpus, max_len, [](sampling_params& p, int index) {
    p.temperature = index % 2 == 0 ? 0.0f : 1.0f;  // half greedy: those must equal the CPU's
    p.top_k = index % 3 == 0 ? 20 : 0;
    p.top_p = index % 4 == 1 ? 0.9f : 1.0f;
    p.seed = static_cast<uint64_t>(index);
  });
}

// Every case through one engine; the outputs by case index (EOS dropped).
std::vector<std::vector<int32_t>> run_all(llm_engine& engine, const std::vector<int32_t>& prompt,
                                          const std::vector<constrained_case>& cases) {
  std::map<int64_t, size_t> case_of;
  for (size_t i = 0; i < cases.size(); ++i) {
    const add_request_result added = engine.add_request(prompt, cases[i].params);
    EXPECT_TRUE(added.ok()) << (added.error ? added.error->message : "") << "\n" << cases[i].oracle_case.dump();
    if (added.ok()) case_of[added.request_id] = i;
  }
  std::vector<std::vector<int32_t>> outputs(cases.size());
  for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) {
    for (const request_output& out : engine.step()) {
      auto& ids = outputs[case_of.at(out.request_id)];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    }
  }
  EXPECT_FALSE(engine.has_unfinished());
  for (auto& ids : outputs) {
    if (!ids.empty() && ids.back() == 2) ids.pop_back();
  }
  return outputs;
}

class structured_output_cuda : public ::testing::TestWithParam<load_format> {};

TEST_P(structured_output_cuda, device_masked_outputs_validate_and_greedy_rows_equal_the_cpu_backends) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "model.safetensors");
  if (const auto why = testing::structured_oracle_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const loaded_model loaded = load_model(load_options{stories_hf, GetParam(), dtype::f32, /*dummy_seed=*/5, false});
  const int block_size = 16, num_blocks = 2048;
  engine_config config;
  config.block_size = block_size;
  config.num_kv_blocks = num_blocks;
  config.max_num_seqs = 64;
  config.max_num_batched_tokens = 2048;
  const tokenizer tok = tokenizer::from_directory(stories_hf);
  const auto vocabulary = make_token_vocabulary(tok, loaded.config.vocab_size, {2});

  cuda_options options;
  options.activation = dtype::f32;
  auto counting = std::make_unique<counting_model>(
      make_cuda_model(loaded.config, loaded.weights, kv_cache_shape{num_blocks, block_size}, options));
  counting_model& gpu = *counting;
  llm_engine on_gpu(std::move(counting), config, std::vector<int32_t>{2}, /*sampler_seed=*/9);
  on_gpu.set_vocabulary(vocabulary);
  llm_engine on_cpu(
      make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{num_blocks, block_size}, 1, dtype::f32), config,
      std::vector<int32_t>{2}, /*sampler_seed=*/9);
  on_cpu.set_vocabulary(vocabulary);

  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a little");
  const int max_len = loaded.config.max_position_embeddings - static_cast<int>(prompt.size()) - 1;
  const std::vector<constrained_case> cases = build_cases(80, max_len);
  const auto gpu_outputs = run_all(on_gpu, prompt, cases);
  const auto cpu_outputs = run_all(on_cpu, prompt, cases);
  EXPECT_GT(gpu.num_masked_rows, static_cast<int>(cases.size())) << "constrained rows must sample on the device";

  nlohmann::ordered_json batch = nlohmann::ordered_json::array();
  for (size_t i = 0; i < cases.size(); ++i) {
    nlohmann::ordered_json c = cases[i].oracle_case;
    c["output"] = tok.decode(gpu_outputs[i], /*skip_special_tokens=*/true);
    batch.push_back(c);
    // Real weights: greedy logits agree between the backends to far below the gaps argmax sees.
    if (GetParam() == load_format::safetensors && cases[i].params.temperature == 0.0f) {
      EXPECT_EQ(gpu_outputs[i], cpu_outputs[i]) << "greedy case " << i << ": " << cases[i].oracle_case.dump();
    }
  }
  std::string error;
  const auto verdicts = testing::run_structured_oracle(batch, error);
  ASSERT_TRUE(verdicts) << error;
  ASSERT_EQ(verdicts->size(), batch.size());
  for (size_t i = 0; i < verdicts->size(); ++i) {
    EXPECT_TRUE((*verdicts)[i].ok) << (*verdicts)[i].why << "\n  case: " << batch[i].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(models, structured_output_cuda,
                         ::testing::Values(load_format::safetensors, load_format::dummy), [](const auto& info) {
                           return std::string(info.param == load_format::dummy ? "random_weights" : "stories260K");
                         });

}  // namespace
}  // namespace troupe
