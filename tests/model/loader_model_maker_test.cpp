#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <gtest/gtest.h>

#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_file.hpp"
#include "model/loader/model_loader.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "model/model_maker.hpp"
#include "model/model_tensors.hpp"
#include "tests/model/loader_test_util.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

model_maker_options small_model(const std::string& arch, const std::filesystem::path& out) {
  model_maker_options options;
  options.arch = arch;
  options.hidden_size = 64;
  options.intermediate_size = 96;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.head_dim = arch == "qwen3" ? 32 : 0;  // Qwen3: head_dim independent of hidden / heads
  options.seed = 11;
  options.tokenizer = testing::shared_model_dir() / "hf";
  options.out = out;
  return options;
}

std::vector<float> as_f32(const weight_tensor& tensor) {
  std::vector<float> values(tensor.num_elements());
  convert_to_f32(tensor.data, tensor.type, values);
  return values;
}

// Runs the llama.cpp oracle on every model in one process; returns its stdout, "" when node is
// not installed, "FAILED: ..." when llama.cpp refused a model.
std::string run_llama_cpp(const std::vector<std::filesystem::path>& ggufs, const std::string& prompt_ids, int steps) {
  if (std::system("command -v node > /dev/null 2>&1") != 0) return "";
  std::string command = "cd '" TROUPE_ORACLE_DIR "' && node llama_cpp_oracle.mjs";
  for (const auto& gguf : ggufs) command += " --model '" + gguf.string() + "'";
  command += " --prompt-ids " + prompt_ids + " --steps " + std::to_string(steps) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return "";
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  int status = ::pclose(pipe);
  return status == 0 ? output : "FAILED: " + output;
}

class loader_model_maker : public ::testing::TestWithParam<std::string> {};

TEST_P(loader_model_maker, hf_and_gguf_hold_the_same_weights) {
  const std::string arch = GetParam();
  testing::scratch_dir dir;
  made_model made = make_model(small_model(arch, dir.path()));
  loaded_model hf = load_model({made.hf_dir});
  loaded_model gguf = load_model({made.gguf_path});
  EXPECT_EQ(hf.config.arch, made.config.arch);
  EXPECT_EQ(gguf.config.arch,
            arch == "mistral" ? architecture::llama : made.config.arch);  // llama.cpp runs Mistral as llama
  EXPECT_EQ(hf.config.vocab_size, 512);                                   // fixed by the tokenizer
  EXPECT_EQ(gguf.config.vocab_size, 512);
  EXPECT_EQ(gguf.config.head_dim, hf.config.head_dim);
  EXPECT_EQ(gguf.config.intermediate_size, hf.config.intermediate_size);
  EXPECT_EQ(gguf.config.attention_bias, hf.config.attention_bias);
  EXPECT_EQ(gguf.config.qk_norm, hf.config.qk_norm);
  EXPECT_EQ(gguf.config.activation, hf.config.activation);
  EXPECT_EQ(gguf.config.tie_word_embeddings, hf.config.tie_word_embeddings);
  EXPECT_EQ(gguf.config.max_position_embeddings, hf.config.max_position_embeddings);
  EXPECT_EQ(gguf.config.sliding_window, hf.config.sliding_window);
  EXPECT_EQ(gguf.config.sliding_layers, hf.config.sliding_layers);
  EXPECT_EQ(gguf.config.query_pre_attn_scalar, hf.config.query_pre_attn_scalar);
  EXPECT_EQ(gguf.config.final_logit_softcapping, hf.config.final_logit_softcapping);
  EXPECT_EQ(gguf.config.attn_logit_softcapping, hf.config.attn_logit_softcapping);
  EXPECT_EQ(gguf.config.rope_local_theta, hf.config.rope_local_theta);
  EXPECT_EQ(gguf.config.moe.num_experts, hf.config.moe.num_experts);
  EXPECT_EQ(gguf.config.moe.experts_per_token, hf.config.moe.experts_per_token);
  EXPECT_EQ(gguf.config.moe.expert_intermediate_size, hf.config.moe.expert_intermediate_size);
  EXPECT_EQ(gguf.config.moe.shared_expert_intermediate_size, hf.config.moe.shared_expert_intermediate_size);
  EXPECT_EQ(gguf.config.moe.norm_topk_prob, hf.config.moe.norm_topk_prob);
  EXPECT_EQ(gguf.config.moe.scoring, hf.config.moe.scoring);
  const bool scaled = arch == "llama3" || arch == "gpt_oss";  // gpt-oss: YaRN by default
  EXPECT_EQ(gguf.config.rope_scaling.has_value(), scaled);
  EXPECT_EQ(hf.config.rope_scaling.has_value(), scaled);
  if (scaled) {
    EXPECT_EQ(gguf.config.rope_scaling->type, hf.config.rope_scaling->type);
    EXPECT_EQ(gguf.config.rope_scaling->truncate, hf.config.rope_scaling->truncate);
    EXPECT_EQ(gguf.config.rope_scaling->original_max_position_embeddings,
              hf.config.rope_scaling->original_max_position_embeddings);
  }
  EXPECT_EQ(gguf.config.eos_token_ids, hf.config.eos_token_ids);
  EXPECT_EQ(hf.config.bos_token_id, 1);
  // Every canonical tensor, bit-identical after un-permuting, unstacking experts, splitting
  // fused tensors and shifting Gemma's norms back.
  int compared = 0;
  for (const tensor_spec& spec : expected_tensors(hf.config)) {
    const weight_tensor& a = hf.weights.get(spec.name);
    const weight_tensor& b = gguf.weights.get(spec.name);
    EXPECT_EQ(a.shape, spec.shape) << spec.name;
    EXPECT_EQ(b.shape, spec.shape) << spec.name;
    if (spec.role == tensor_role::norm_offset) {
      // Gemma: GGUF stores 1 + w; the multiplier the backends apply, 1 + w, is bit-identical.
      std::vector<float> x = as_f32(a), y = as_f32(b);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(1.0f + x[i], 1.0f + y[i]) << spec.name << " " << i;
    } else {
      EXPECT_EQ(as_f32(a), as_f32(b)) << spec.name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(expected_tensors(gguf.config).size()));
  // The tokenizer travels inside the GGUF and encodes like the HF copy.
  tokenizer_sources from_gguf = load_tokenizer_sources(made.gguf_path);
  tokenizer_sources from_hf = load_tokenizer_sources(made.hf_dir);
  EXPECT_EQ(tokenizer::from_json(from_gguf.tokenizer_json, from_gguf.tokenizer_config).encode("Once upon a time"),
            tokenizer::from_json(from_hf.tokenizer_json, from_hf.tokenizer_config).encode("Once upon a time"));
}

INSTANTIATE_TEST_SUITE_P(arches, loader_model_maker,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe",
                                           "qwen3_moe", "gpt_oss", "gemma2", "gemma3", "phi3"));

// llama.cpp itself (node-llama-cpp, offline) loads every architecture's GGUF, Q8_0 included,
// and decodes: tensor names, shapes, metadata and tokenizer are all what it expects.
TEST(loader_model_maker_options, llama_cpp_loads_and_runs_every_arch) {
  testing::scratch_dir dir;
  const std::vector<std::string> arches = {"llama",     "llama3",    "mistral", "qwen2",  "qwen3",  "mixtral",
                                           "qwen2_moe", "qwen3_moe", "gpt_oss", "gemma2", "gemma3", "phi3"};
  std::vector<std::filesystem::path> ggufs;
  for (const auto& arch : arches) {
    model_maker_options options = small_model(arch, dir / arch);
    options.type = arch == "qwen2" ? dtype::f16 : dtype::q8_0;
    options.init_stddev = 0.5f;
    ggufs.push_back(make_model(options).gguf_path);
  }
  std::string output = run_llama_cpp(ggufs, "1,403,407", 3);
  if (output.empty()) GTEST_SKIP() << "node is not installed";
  ASSERT_EQ(output.rfind("FAILED", 0), std::string::npos) << output;
  std::istringstream lines(output);
  std::string line;
  size_t count = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json result = nlohmann::json::parse(line);
    ASSERT_LT(count, ggufs.size());
    EXPECT_EQ(result["model"], ggufs[count].string());
    ASSERT_EQ(result["generated_ids"].size(), 3u) << line;
    for (const auto& id : result["generated_ids"]) EXPECT_LT(id.get<int>(), 512);
    ++count;
  }
  EXPECT_EQ(count, ggufs.size()) << output;
}

// Long-context benchmarks need models whose context reaches 32k and beyond (issue 31): the
// length reaches config.json and the GGUF's context_length alike.
TEST(loader_model_maker_options, long_max_position_embeddings_reach_both_copies) {
  for (const char* arch : {"qwen2", "llama3"}) {
    testing::scratch_dir dir;
    model_maker_options options = small_model(arch, dir.path());
    options.max_position_embeddings = 131072;
    const made_model made = make_model(options);
    EXPECT_EQ(load_model({made.hf_dir}).config.max_position_embeddings, 131072) << arch;
    EXPECT_EQ(load_model({made.gguf_path}).config.max_position_embeddings, 131072) << arch;
  }
}

TEST(loader_model_maker_options, q8_0_gives_f16_hf_and_q8_0_gguf) {
  testing::scratch_dir dir;
  model_maker_options options = small_model("llama", dir.path());
  options.type = dtype::q8_0;
  made_model made = make_model(options);
  loaded_model hf = load_model({made.hf_dir});
  loaded_model gguf = load_model({made.gguf_path});
  EXPECT_EQ(hf.weights.get("model.layers.0.self_attn.q_proj.weight").type, dtype::f16);
  EXPECT_EQ(gguf.weights.get("model.layers.0.self_attn.q_proj.weight").type, dtype::q8_0);
  EXPECT_EQ(gguf.weights.get("model.layers.0.input_layernorm.weight").type, dtype::f32);
  // Same weights up to rounding: f16 vs Q8_0 of the same values.
  std::vector<float> a = as_f32(hf.weights.get("model.layers.1.self_attn.k_proj.weight"));
  std::vector<float> b = as_f32(gguf.weights.get("model.layers.1.self_attn.k_proj.weight"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.003f) << i;
}

TEST(loader_model_maker_options, bad_options_are_named) {
  testing::scratch_dir dir;
  model_maker_options options = small_model("llama", dir.path());
  options.vocab_size = 1000;
  testing::expect_error([&] { make_model(options); }, {"--vocab-size 1000", "512"});
  options = small_model("gpt2", dir.path());
  testing::expect_error([&] { make_model(options); }, {"gpt2", "llama3"});
  options = small_model("llama", dir.path());
  options.num_kv_heads = 3;
  testing::expect_error([&] { make_model(options); }, {"--kv-heads 3"});
  options = small_model("qwen3_moe", dir.path());
  options.num_experts = 4;
  options.experts_per_token = 5;
  testing::expect_error([&] { make_model(options); }, {"--experts-per-token 5", "--experts 4"});
  options = small_model("llama", dir.path());
  options.num_experts = 4;
  testing::expect_error([&] { make_model(options); }, {"--experts", "llama"});
  options = small_model("qwen3", dir.path());
  options.sliding_window = 64;
  testing::expect_error([&] { make_model(options); }, {"--sliding-window"});
  options = small_model("phi3", dir.path());
  options.rope_scaling = "ntk";
  testing::expect_error([&] { make_model(options); }, {"--rope-scaling 'ntk'"});
  options = small_model("phi3", dir.path());
  options.rotary_dim = 7;
  testing::expect_error([&] { make_model(options); }, {"--rotary-dim"});
}

}  // namespace
}  // namespace troupe
