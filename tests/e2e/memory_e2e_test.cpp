// Issue 21's memory bound, as a user runs it: `troupe generate` logs its RSS after load and after
// the request beside the weights' and the KV pool's bytes (engine/served_model.cpp), and a
// Q4_K_M model's RSS stays within the fixed overhead plus 1.10 × (weights + KV pool), the issue's
// target.
//
// The fixed overhead F is what a model with next to no weights costs: stories260K (1.1 MiB of
// weights) run the same way, in the same test, so the bound holds on any machine (the binary's
// libraries, thread stacks and allocator arenas: 23 MiB since cuBLASLt is loaded only for a CUDA
// model, 170 MiB before, docs/benchmarks.md). The model-dependent rest measured 1.067 × (weights
// + KV pool) on this model: the repacked layout's extra bytes (5.6 % of the Q4_K matrices, 1 % of
// the Q6_K ones) and buffers sized by the model's shape. It was 1.21 × while the repacked copy's
// last, partly used huge page was resident whole (1.9 MiB) and the loader's freed temporaries
// stayed in jemalloc's dirty pages (3.5 MiB, kept 10 s). Where the kernel's THP mode is "always",
// that last piece may become a huge page anyway: the bound then allows its 2 MiB. The Q4_K_M
// model is made here (make-model, then quantize) at 68 M parameters: a second resident copy of its
// weights (the mapped pages left beside the repacked ones) is 2 × and puts it far past the bound.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/e2e/e2e_support.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

// What one `troupe generate` logged, in MiB.
struct memory_log {
  double rss_after_load = -1, weights = -1, kv_pool = -1;
  double rss_after_request = -1, peak = -1;
};

memory_log memory_of(const std::string& err) {
  memory_log m;
  const size_t load = err.find("memory after load: ");
  if (load != std::string::npos) {
    double peak = 0;
    std::sscanf(err.c_str() + load, "memory after load: RSS %lf MiB (peak %lf MiB); weights %lf MiB, KV pool %lf MiB",
                &m.rss_after_load, &peak, &m.weights, &m.kv_pool);
  }
  const size_t request = err.find("memory after the request: ");
  if (request != std::string::npos) {
    std::sscanf(err.c_str() + request, "memory after the request: RSS %lf MiB (peak %lf MiB)", &m.rss_after_request,
                &m.peak);
  }
  return m;
}

// The kernel puts any large enough anonymous memory in huge pages, not only what asks for them.
bool huge_pages_always() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(file, modes);
  return modes.find("[always]") != std::string::npos;
}

memory_log generate(const std::string& model) {
  run_result r = run_troupe("generate --model " + shell_quote(model) +
                            " --prompt 'Once upon a time' --temperature 0 --threads 2 --max-tokens 32");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const memory_log m = memory_of(r.err);
  EXPECT_GE(m.rss_after_request, 0) << "no memory lines in the log:\n" << r.err;
  return m;
}

TEST(memory_e2e, a_q4_k_m_models_rss_stays_within_the_fixed_overhead_and_1_1_times_weights_and_kv_pool) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "gguf/stories260K-f32.gguf");
  testing::scratch_dir dir;
  const memory_log tiny = generate((stories_root / "gguf/stories260K-f32.gguf").string());
  const double fixed = tiny.rss_after_request - tiny.weights - tiny.kv_pool;

  run_result made = run_troupe(
      "make-model --arch llama --hidden-size 1024 --intermediate-size 2816 --layers 6 --heads 16 "
      "--kv-heads 4 --dtype f16 --seed 7 --tokenizer " +
      shell_quote(stories_dir) + " --out " + shell_quote((dir / "f16").string()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string q4 = (dir / "q4_k_m.gguf").string();
  run_result quantized = run_troupe("quantize " + shell_quote((dir / "f16/model.gguf").string()) + " " +
                                    shell_quote(q4) + " --type Q4_K_M --threads 2");
  ASSERT_EQ(quantized.exit_code, 0) << quantized.err;
  const memory_log m = generate(q4);
  ASSERT_GT(m.weights, 30.0) << "the model is meant to outweigh the fixed overhead";
  const double bound = fixed + 1.10 * (m.weights + m.kv_pool) + (huge_pages_always() ? 2.0 : 0.0);
  std::printf(
      "fixed overhead %.1f MiB (stories260K: RSS %.1f, weights %.1f, KV pool %.1f); Q4_K_M: weights %.1f MiB, "
      "KV pool %.1f MiB, RSS after load %.1f, after the request %.1f, peak %.1f; bound %.1f MiB\n",
      fixed, tiny.rss_after_request, tiny.weights, tiny.kv_pool, m.weights, m.kv_pool, m.rss_after_load,
      m.rss_after_request, m.peak, bound);
  EXPECT_LE(m.rss_after_load, bound);
  EXPECT_LE(m.rss_after_request, bound);
}

}  // namespace
}  // namespace troupe::test
