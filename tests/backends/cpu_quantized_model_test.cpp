// Whole forwards with quantized weights against the very same weights dequantized to f32: the
// quantized model runs the integer kernels (activations quantized to int8 per 32 values), its
// twin the float kernels, so what differs is only the activation quantization. Weights are
// quantized by llama.cpp's own library (tests/ggml_oracle.hpp), every matrix whose rows are whole
// blocks of the type.
//
// Tolerance. Quantizing 32 activations to x̂ = d q (d = max|x| / 127) errs by at most d / 2 per
// value, uniformly: an rms error of d / sqrt(12) = max|x| / 440, which is 0.5 % of the values'
// rms for Gaussian blocks (max / rms ~ 2.1) and 1.25 % for blocks with max / rms up to 5.5 (the
// heavy tails after SiLU * up in random models). A matrix product passes that relative error on,
// and the P products an error crosses on its way to the logits (7 per layer) add theirs in
// quadrature, so the logits' normalized error (||a - b|| / ||b||) should average at most
// sqrt(P) x 1.25 %, and no position should exceed twice that. Measured (this CPU): stories260K
// (P = 35, bound 7.4 %) 0.5-0.7 % on average, 4.4 % at worst; the random model (P = 21, bound
// 5.7 %) 4.1-4.2 % on average for every type, 7.9 % at worst. A broken kernel errs by ~100 %.
// Where the f32 twin's top-1 beats its top-2 by a quarter of its logits' rms, both must pick the
// same token.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/quant_repack.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/backends/quant_test_support.hpp"
#include "tests/scratch_dir.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

double normalized_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

struct twin_comparison {
  double max_error = 0;
  double mean_error = 0;
  int argmax_checked = 0;
  int argmax_agreed = 0;
};

// Teacher-forced logits of both models over prompt + forced tokens.
twin_comparison compare_twins(const model_config& config, const test::quantized_pair& pair,
                              const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced) {
  auto quantized = make_cpu_model(config, pair.quantized, {64, 16}, 1);
  auto dequantized = make_cpu_model(config, pair.dequantized, {64, 16}, 1);
  const auto q_logits = test::teacher_forced_logits(*quantized, prompt, forced);
  const auto f_logits = test::teacher_forced_logits(*dequantized, prompt, forced);
  twin_comparison result;
  for (size_t p = 0; p < f_logits.size(); ++p) {
    const double error = normalized_error(q_logits[p], f_logits[p]);
    result.max_error = std::max(result.max_error, error);
    result.mean_error += error / f_logits.size();
    const std::vector<float>& f = f_logits[p];
    const int top = test::argmax(f.data(), static_cast<int>(f.size()));
    double second = -INFINITY, sum_squares = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      if (static_cast<int>(i) != top) second = std::max(second, double(f[i]));
      sum_squares += double(f[i]) * f[i];
    }
    if (f[top] - second > 0.25 * std::sqrt(sum_squares / f.size())) {
      ++result.argmax_checked;
      result.argmax_agreed += test::argmax(q_logits[p].data(), static_cast<int>(f.size())) == top;
    }
  }
  return result;
}

// `products`: the matrix products an activation error crosses on its way to the logits.
void expect_close_twins(const twin_comparison& c, int products, int positions, const std::string& label) {
  const double mean_bound = std::sqrt(static_cast<double>(products)) * 0.0125;
  std::printf("  %-8s normalized logit error: mean %.4f (bound %.4f), max %.4f; argmax %d/%d\n", label.c_str(),
              c.mean_error, mean_bound, c.max_error, c.argmax_agreed, c.argmax_checked);
  EXPECT_LT(c.mean_error, mean_bound) << label;
  EXPECT_LT(c.max_error, 2 * mean_bound) << label;
  EXPECT_GE(c.argmax_checked, positions / 4) << label << ": too few clear winners to check";
  EXPECT_EQ(c.argmax_agreed, c.argmax_checked) << label;
}

TEST(cpu_quantized_model, stories260k_quantized_runs_like_its_dequantized_twin) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const loaded_model loaded = load_model(load_options{(test::stories260k_dir / "hf").string()});
  std::ifstream refs_file(test::stories260k_dir / "refs.json");
  const auto refs = nlohmann::json::parse(refs_file).at("references");
  const auto prompt = refs[0].at("input_ids").get<std::vector<int32_t>>();
  const auto forced = refs[0].at("generated_ids").get<std::vector<int32_t>>();
  // Its rows are 64 wide (the MLP's down projection, 172, stays f32): the types of 32-blocks.
  for (dtype type : {dtype::q8_0, dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl, dtype::mxfp4}) {
    const test::quantized_pair pair = test::quantize_store(loaded.weights, type);
    ASSERT_EQ(pair.num_quantized, 5 * 6 + 1) << dtype_name(type);  // q, k, v, o, gate, up per layer; embeddings
    expect_close_twins(compare_twins(loaded.config, pair, prompt, forced), 7 * 5, static_cast<int>(forced.size()),
                       std::string(dtype_name(type)));
  }
}

// A random Llama whose rows fit 256-blocks, for the k-quants and IQ4_XS (and a legacy type).
TEST(cpu_quantized_model, random_model_with_k_quants_runs_like_its_dequantized_twin) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const model_config config = test::k_quant_llama_config(512, 3, 400);
  // Weights large enough that the logits are peaked (distinct top-1s) rather than flat.
  const weight_store weights = make_dummy_weights(config, dtype::f32, 5, {0.1f, 0.2f});
  std::mt19937 rng(6);
  std::vector<int32_t> prompt(24), forced(40);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % config.vocab_size);
  for (auto& t : forced) t = static_cast<int32_t>(rng() % config.vocab_size);
  for (dtype type : {dtype::q2_k, dtype::q3_k, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs, dtype::q4_0}) {
    const test::quantized_pair pair = test::quantize_store(weights, type);
    ASSERT_EQ(pair.num_quantized, 3 * 7 + 2) << dtype_name(type);  // 7 matrices per layer, embeddings, lm_head
    expect_close_twins(compare_twins(config, pair, prompt, forced), 7 * 3, static_cast<int>(forced.size()),
                       std::string(dtype_name(type)));
  }
}

// Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0 and Q8_0 matrices are repacked at load (backends/cpu/quant_repack.hpp): a
// prompt and 16 decode steps of a model in any of these types give the logits of the same model
// read in the GGUF layout, bit for bit.
TEST(cpu_quantized_model, repacked_models_give_the_bits_of_the_gguf_layout) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const model_config config = test::k_quant_llama_config(768, 2, 300);
  const weight_store weights = make_dummy_weights(config, dtype::f32, 12, {0.1f, 0.2f});
  std::mt19937 rng(13);
  std::vector<int32_t> prompt(20), forced(16);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % config.vocab_size);
  for (auto& t : forced) t = static_cast<int32_t>(rng() % config.vocab_size);
  for (dtype type : {dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs, dtype::q4_0, dtype::q8_0}) {
    const test::quantized_pair pair = test::quantize_store(weights, type);
    std::vector<std::vector<float>> logits[2];
    for (bool repack : {false, true}) {
      cpu::set_weight_repacking(repack);
      auto m = make_cpu_model(config, pair.quantized, {64, 16}, 2);
      logits[repack] = test::teacher_forced_logits(*m, prompt, forced);
    }
    cpu::set_weight_repacking(true);
    for (size_t step = 0; step < forced.size(); ++step) {
      ASSERT_EQ(std::memcmp(logits[0][step].data(), logits[1][step].data(), logits[0][step].size() * sizeof(float)), 0)
          << dtype_name(type) << ", step " << step << ": repacked logits differ from the GGUF layout's";
    }
  }
}

// A Llama GGUF's q/k rows are un-permuted by the loader into copies of its own; once the CPU model
// has repacked them it names them (cpu_weights_not_read) and release_copies frees them, so memory after
// load holds each weight once. The logits stay those of a model whose store kept its copies, the
// released tensors are refused by name, and with repacking off nothing is named.
TEST(cpu_quantized_model, repacked_q_and_k_copies_are_released_and_the_logits_do_not_change) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
  testing::scratch_dir dir;
  model_maker_options options;
  options.arch = "llama";
  options.hidden_size = 256;
  options.intermediate_size = 512;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.seed = 21;
  options.init_stddev = 0.1f;
  options.type = dtype::q4_k;
  options.tokenizer = (test::stories260k_dir / "hf").string();
  options.out = dir.path();
  const made_model made = make_model(options);
  std::vector<int32_t> prompt(12), forced(8);
  std::mt19937 rng(5);
  for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % (made.config.vocab_size - 3));
  for (auto& t : forced) t = static_cast<int32_t>(3 + rng() % (made.config.vocab_size - 3));

  loaded_model kept = load_model({made.gguf_path});
  auto kept_model = make_cpu_model(kept.config, kept.weights, {8, 16}, 1);
  const auto want = test::teacher_forced_logits(*kept_model, prompt, forced);

  loaded_model released = load_model({made.gguf_path});
  auto model = make_cpu_model(released.config, released.weights, {8, 16}, 1);
  const std::vector<std::string> not_read = cpu_weights_not_read(*model);
  if (not_read.empty()) GTEST_SKIP() << "this CPU's level repacks nothing";
  size_t copies = 0;  // the bytes of every layer's q and k: the loader's only copies
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* part : {"q_proj", "k_proj"}) {
      const std::string name = "model.layers." + std::to_string(layer) + ".self_attn." + part + ".weight";
      EXPECT_NE(std::find(not_read.begin(), not_read.end(), name), not_read.end()) << name << " is not named";
      ASSERT_NE(released.weights.get(name).owned_copy, nullptr) << name;
      copies += released.weights.get(name).num_bytes;
    }
  }
  EXPECT_EQ(released.weights.release_copies(not_read), copies);
  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(released.weights.find(q0)->data, nullptr);
  try {
    released.weights.get(q0);
    FAIL() << "a released tensor was handed out";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(q0), std::string::npos) << e.what();
  }
  const auto got = test::teacher_forced_logits(*model, prompt, forced);
  for (size_t step = 0; step < want.size(); ++step) {
    ASSERT_EQ(std::memcmp(got[step].data(), want[step].data(), want[step].size() * sizeof(float)), 0)
        << "step " << step << ": logits changed when the q/k copies were released";
  }

  cpu::set_weight_repacking(false);
  auto plain = make_cpu_model(kept.config, kept.weights, {8, 16}, 1);
  cpu::set_weight_repacking(true);
  EXPECT_TRUE(cpu_weights_not_read(*plain).empty()) << "a model that repacks nothing reads every weight";
}

}  // namespace
}  // namespace troupe
