// Architecture check against llama.cpp: for Llama 3 (rope_scaling), Mistral, Qwen2 (qkv bias,
// tied embeddings) and Qwen3 (q/k norm), one small random GQA model written by the model maker
// in HF and GGUF form; Troupe runs the HF copy, llama.cpp (node-llama-cpp through
// tests/oracles/llama_cpp_oracle.mjs) the GGUF copy, and the greedy tokens must agree for 16
// steps on 8 prompts.
//
// Tolerance: a differing token is accepted only at a near-tie, where llama.cpp's top-2 logit
// margin is below 2e-2, and that prompt's comparison ends there (the continuations diverge).
// Not 1e-3: on these random models Troupe's and llama.cpp's margins differ by up to ~8e-3 on
// the llama-arch GGUFs (llama3, mistral) and by ~1e-4 on qwen2, so flips happen at margins of
// ~1e-2. The likely cause is llama.cpp's f16 K/V cache (Q·K in f16); the oracle has no f32
// option, and forcing F32 through node-llama-cpp's experimentalKvCacheKeyType did not change
// its margins, so this is not proven. Every near-tie is printed with both sides' margins.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "kernels/cpu/cpu_model.hpp"
#include "kernels/loader/model_loader.hpp"
#include "kernels/loader/model_maker.hpp"
#include "tests/kernels/cpu_greedy_support.hpp"

namespace troupe {
namespace {

constexpr int num_steps = 16;
constexpr int num_prompts = 8;
constexpr double near_tie = 2e-2;

std::string run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  return output;
}

struct oracle_result {
  std::vector<int32_t> generated;
  std::vector<double> margins;
};

const std::vector<std::string> archs = {"llama3", "mistral", "qwen2", "qwen3"};

model_maker_options small_model(const std::string& arch, uint64_t seed) {
  model_maker_options options;
  options.arch = arch;
  options.hidden_size = 128;
  options.intermediate_size = 256;
  options.num_layers = 3;
  options.num_heads = 8;
  options.num_kv_heads = 2;
  options.seed = seed;
  options.init_stddev = 0.15f;  // peaked logits: few near-ties between random tokens
  options.tokenizer = std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf";
  options.out = std::filesystem::path(TROUPE_BINARY_DIR) / "cpu_arch_models" / arch;
  if (arch == "llama3") options.max_position_embeddings = 131072;
  if (arch == "qwen2") options.tie_word_embeddings = true;
  if (arch == "qwen3") options.head_dim = 32;  // q_dim 256 != hidden 128, as Qwen3 allows
  return options;
}

// Makes the four models and runs llama.cpp on all of them, one node process per prompt (the
// oracle takes several models at once, and starting llama.cpp dominates its time).
class cpu_arch_vs_llama_cpp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (run_command("node --version 2>/dev/null").rfind("v", 0) != 0) return;
    std::string model_flags;
    for (size_t a = 0; a < archs.size(); ++a) {
      model_maker_options options = small_model(archs[a], 31 + a);
      std::filesystem::remove_all(options.out);
      made_[archs[a]] = make_model(options);
      model_flags += " --model '" + made_[archs[a]].gguf_path.string() + "'";
    }
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> token(3, made_.begin()->second.config.vocab_size - 1);
    for (int p = 0; p < num_prompts; ++p) {
      std::vector<int32_t> prompt = {1};
      for (int i = 0; i < 2 + p * 3; ++i) prompt.push_back(token(rng));
      prompts_.push_back(prompt);
      std::string ids;
      for (int32_t id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      const std::string command = "node " + std::string(TROUPE_ORACLE_DIR) + "/llama_cpp_oracle.mjs" +
                                  model_flags + " --prompt-ids " + ids + " --steps " + std::to_string(num_steps);
      std::istringstream lines(run_command(command + " 2>&1"));
      for (const std::string& arch : archs) {
        std::string line;
        std::getline(lines, line);
        try {
          const auto json = nlohmann::json::parse(line);
          oracle_[arch].push_back({json.at("generated_ids").get<std::vector<int32_t>>(),
                                   json.at("margins").get<std::vector<double>>()});
        } catch (const std::exception&) {
          oracle_error_ = "llama.cpp oracle failed: " + command + "\n" + line;
          return;
        }
      }
    }
  }

  void expect_agreement(const std::string& arch) {
    if (made_.empty()) GTEST_SKIP() << "node is not installed; the llama.cpp oracle cannot run";
    ASSERT_TRUE(oracle_error_.empty()) << oracle_error_;
    const loaded_model loaded = load_model(load_options{made_[arch].hf_dir});
    auto m = make_cpu_model(loaded.config, loaded.weights, {64, 16}, 2);
    int compared = 0, flips = 0;
    for (int p = 0; p < num_prompts; ++p) {
      const auto ours = test::greedy_generate(*m, prompts_[p], num_steps);
      const oracle_result& theirs = oracle_[arch][p];
      ASSERT_EQ(theirs.generated.size(), static_cast<size_t>(num_steps));
      for (int step = 0; step < num_steps; ++step) {
        ++compared;
        const bool same = ours.generated[step] == theirs.generated[step];
        if (theirs.margins[step] < near_tie || !same) {
          std::printf("[%s] prompt %d step %d: %s, margins llama.cpp %.2e / Troupe %.2e (tokens %d / %d)\n",
                      arch.c_str(), p, step, same ? "near-tie, same token" : "TOKENS DIFFER",
                      theirs.margins[step], ours.margins[step], theirs.generated[step], ours.generated[step]);
        }
        if (same) continue;
        EXPECT_LT(theirs.margins[step], near_tie)
            << arch << " prompt " << p << " step " << step << ": Troupe " << ours.generated[step]
            << ", llama.cpp " << theirs.generated[step] << " with margin " << theirs.margins[step];
        ++flips;
        break;
      }
    }
    std::printf("[%s] %d greedy tokens compared, %d flips at near-ties\n", arch.c_str(), compared, flips);
  }

  static inline std::map<std::string, made_model> made_;
  static inline std::map<std::string, std::vector<oracle_result>> oracle_;
  static inline std::vector<std::vector<int32_t>> prompts_;
  static inline std::string oracle_error_;
};

TEST_F(cpu_arch_vs_llama_cpp, llama3_with_rope_scaling) { expect_agreement("llama3"); }
TEST_F(cpu_arch_vs_llama_cpp, mistral) { expect_agreement("mistral"); }
TEST_F(cpu_arch_vs_llama_cpp, qwen2_with_qkv_bias_and_tied_embeddings) { expect_agreement("qwen2"); }
TEST_F(cpu_arch_vs_llama_cpp, qwen3_with_qk_norm) { expect_agreement("qwen3"); }

}  // namespace
}  // namespace troupe
