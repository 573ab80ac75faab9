// Architecture check against llama.cpp: for Llama 3 (rope_scaling), Mistral, Qwen2 (qkv bias,
// tied embeddings) and Qwen3 (q/k norm), one small random GQA model written by the model maker
// in HF and GGUF form. llama.cpp (node-llama-cpp through tests/oracles/llama_cpp_oracle.mjs)
// decodes the GGUF copy greedily for 16 steps on 8 prompts; Troupe runs the HF copy
// teacher-forced along llama.cpp's tokens, so every step of every prompt is compared on the same
// prefix, and a float64 forward pass written from the HF definitions
// (tests/oracles/llama_reference.mjs) runs the same tokens as the ground truth.
//
// Criterion, from measurement rather than hope:
// - Troupe's logits are within logit_tolerance of the float64 reference at every step (whole
//   vocabulary), and within logit_tolerance of llama.cpp's on llama.cpp's top tokens.
// - Troupe's argmax is llama.cpp's token at every step, except where Troupe's own margin between
//   the two is at most 2 * logit_tolerance: if each logit may be off by logit_tolerance, that
//   margin may be off by twice as much, so only such a near-tie may flip. Such flips are printed
//   and counted; no other disagreement is accepted. With no flip, Troupe's own greedy decoding
//   equals llama.cpp's token for token (teacher forcing on a prefix Troupe would also have
//   chosen is the same computation).
//
// llama.cpp runs with an F32 K/V cache and flash attention off (the oracle's --f32-kv-cache).
// Its defaults round Q·K and the attention weights to f16 on the CPU: measured on these models,
// that moves its logits by up to ~1.5e-2 from the float64 reference on every architecture, while
// Troupe (f32 throughout) stays within ~1.3e-5; greedy tokens then flipped at margins near 1e-2.
// With F32 attention llama.cpp's logits are within ~1.1e-5 of the reference too, so the
// tolerance below is ~8x the largest error either engine showed.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "tests/backends/cpu_greedy_support.hpp"

namespace troupe {
namespace {

constexpr int num_steps = 16;
constexpr int num_prompts = 8;
constexpr int num_oracle_logits = 8;     // llama.cpp's top tokens compared per step
constexpr double logit_tolerance = 1e-4;  // logits of magnitude ~5 on these models
constexpr double flip_bound = 2 * logit_tolerance;
constexpr double close_call = 1e-2;  // margins this small are printed (they flipped with f16 attention)

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
  std::vector<std::vector<std::pair<int32_t, double>>> top;  // [step][num_oracle_logits] (id, logit)
  std::vector<std::vector<double>> reference_logits;         // [step][vocab] float64 forward pass
};

const std::vector<std::string> archs = {"llama3", "mistral", "qwen2", "qwen3"};

// ctest runs each test of this suite in its own process, two at a time, and every process sets
// the whole suite up: each writes its models and oracle requests in a folder of its own, or one
// process's remove_all pulls the models from under another.
std::filesystem::path work_dir() {
  return std::filesystem::path(TROUPE_BINARY_DIR) / "cpu_arch_models" / std::to_string(getpid());
}

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
  options.out = work_dir() / arch;
  if (arch == "llama3") options.max_position_embeddings = 131072;
  if (arch == "qwen2") options.tie_word_embeddings = true;
  if (arch == "qwen3") options.head_dim = 32;  // q_dim 256 != hidden 128, as Qwen3 allows
  return options;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// Makes the four models, runs llama.cpp on all of them (one node process per prompt: the oracle
// takes several models at once, and starting llama.cpp dominates its time), then the float64
// reference on llama.cpp's tokens (one node process for everything).
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
      const std::string command = "node " + std::string(TROUPE_ORACLE_DIR) + "/llama_cpp_oracle.mjs" + model_flags +
                                  " --f32-kv-cache --prompt-ids " + join_ids(prompt) + " --steps " +
                                  std::to_string(num_steps) + " --logits " + std::to_string(num_oracle_logits);
      std::istringstream lines(run_command(command + " 2>&1"));
      for (const std::string& arch : archs) {
        std::string line;
        std::getline(lines, line);
        try {
          const auto json = nlohmann::json::parse(line);
          oracle_result result{json.at("generated_ids").get<std::vector<int32_t>>(),
                               json.at("margins").get<std::vector<double>>(),
                               json.at("top").get<std::vector<std::vector<std::pair<int32_t, double>>>>(),
                               {}};
          oracle_[arch].push_back(std::move(result));
        } catch (const std::exception&) {
          oracle_error_ = "llama.cpp oracle failed: " + command + "\n" + line;
          return;
        }
      }
    }
    run_reference();
  }

  static void run_reference() {
    nlohmann::json request;
    request["runs"] = nlohmann::json::array();
    for (const std::string& arch : archs) {
      for (int p = 0; p < num_prompts; ++p) {
        request["runs"].push_back({{"model", made_[arch].hf_dir.string()},
                                   {"prompt_ids", prompts_[p]},
                                   {"forced_ids", oracle_[arch][p].generated}});
      }
    }
    const auto request_path = work_dir() / "reference_request.json";
    std::ofstream(request_path) << request.dump();
    const std::string command =
        "node " + std::string(TROUPE_ORACLE_DIR) + "/llama_reference.mjs '" + request_path.string() + "'";
    std::istringstream lines(run_command(command + " 2>&1"));
    for (const std::string& arch : archs) {
      for (int p = 0; p < num_prompts; ++p) {
        std::string line;
        std::getline(lines, line);
        try {
          oracle_[arch][p].reference_logits = nlohmann::json::parse(line).at("logits").get<std::vector<std::vector<double>>>();
        } catch (const std::exception&) {
          oracle_error_ = "float64 reference failed: " + command + "\n" + line;
          return;
        }
      }
    }
  }

  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(work_dir(), ignored);
  }

  void expect_agreement(const std::string& arch) {
    if (made_.empty()) GTEST_SKIP() << "node is not installed; the llama.cpp oracle cannot run";
    ASSERT_TRUE(oracle_error_.empty()) << oracle_error_;
    const loaded_model loaded = load_model(load_options{made_[arch].hf_dir});
    const int vocab = loaded.config.vocab_size;
    // An f32 cache, as the oracle's: the bounds below are of f32 arithmetic (an f16 cache alone
    // moves logits by ~5e-3; tests/backends/cpu_kv_dtype_test.cpp measures that).
    auto m = make_cpu_model(loaded.config, loaded.weights, {64, 16}, 2, dtype::f32);
    int compared = 0, flips = 0;
    double worst_vs_reference = 0, worst_vs_llama_cpp = 0, closest = INFINITY;
    for (int p = 0; p < num_prompts; ++p) {
      const oracle_result& theirs = oracle_[arch][p];
      ASSERT_EQ(theirs.generated.size(), static_cast<size_t>(num_steps));
      ASSERT_EQ(theirs.reference_logits.size(), static_cast<size_t>(num_steps));
      const auto ours = test::teacher_forced_logits(*m, prompts_[p], theirs.generated);
      const int flips_before = flips;
      for (int step = 0; step < num_steps; ++step) {
        ++compared;
        const std::vector<float>& logits = ours[step];
        const std::vector<double>& reference = theirs.reference_logits[step];
        ASSERT_EQ(reference.size(), static_cast<size_t>(vocab));
        double vs_reference = 0, vs_llama_cpp = 0;
        for (int i = 0; i < vocab; ++i) vs_reference = std::max(vs_reference, std::abs(logits[i] - reference[i]));
        for (const auto& [id, logit] : theirs.top[step]) vs_llama_cpp = std::max(vs_llama_cpp, std::abs(logits[id] - logit));
        worst_vs_reference = std::max(worst_vs_reference, vs_reference);
        worst_vs_llama_cpp = std::max(worst_vs_llama_cpp, vs_llama_cpp);
        EXPECT_LE(vs_reference, logit_tolerance) << arch << " prompt " << p << " step " << step << ": logits vs float64";
        EXPECT_LE(vs_llama_cpp, logit_tolerance) << arch << " prompt " << p << " step " << step << ": logits vs llama.cpp";

        const int32_t expected = theirs.generated[step];
        const int32_t chosen = test::argmax(logits.data(), vocab);
        float second = -INFINITY;
        for (int i = 0; i < vocab; ++i)
          if (i != chosen) second = std::max(second, logits[i]);
        const double margin = logits[chosen] - second;
        closest = std::min(closest, margin);
        if (chosen != expected || margin < close_call) {
          std::printf("[%s] prompt %d step %d: %s, margins llama.cpp %.2e / Troupe %.2e (tokens %d / %d)\n", arch.c_str(),
                      p, step, chosen == expected ? "close call, same token" : "near-tie flip", theirs.margins[step], margin,
                      expected, chosen);
        }
        if (chosen == expected) continue;
        ++flips;
        EXPECT_LE(logits[chosen] - logits[expected], flip_bound)
            << arch << " prompt " << p << " step " << step << ": Troupe picks " << chosen << ", llama.cpp " << expected
            << ", and Troupe's margin between them exceeds what the logit tolerance explains";
      }
      // The issue's own words, checked directly: free-running greedy decoding gives llama.cpp's
      // 16 tokens (implied by the steps above when nothing flipped; here through the normal path).
      if (flips == flips_before) {
        EXPECT_EQ(test::greedy_generate(*m, prompts_[p], num_steps).generated, theirs.generated) << arch << " prompt " << p;
      }
    }
    std::printf("[%s] %d greedy steps compared: max |logit error| %.2e vs float64, %.2e vs llama.cpp; smallest margin "
                "%.2e; %d near-tie flips (bound %.0e)\n",
                arch.c_str(), compared, worst_vs_reference, worst_vs_llama_cpp, closest, flips, flip_bound);
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
