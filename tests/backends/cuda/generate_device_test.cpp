// `troupe generate --device cuda` as a user runs it: the real binary on stories260K in f32 must
// print exactly what the CPU backend prints, greedy, for every reference prompt. Skips without
// a GPU (the GPU-less fallback is checked by tests/e2e/generate_e2e_test.cpp).

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {
namespace {

TEST(generate_device, cuda_f32_prints_what_the_cpu_prints) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "troupe is not built";
  const auto refs = stories_references();
  for (const auto& ref : refs) {
    const std::string args = "generate --model " + shell_quote(stories_dir) + " --prompt " +
                             shell_quote(ref.at("prompt").get<std::string>()) +
                             " --temperature 0 --threads 1 --max-tokens " +
                             std::to_string(ref.at("max_new_tokens").get<int>());
    const run_result cpu = run_troupe(args + " --device cpu");
    const run_result gpu = run_troupe(args + " --device cuda --dtype f32");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
    ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
    EXPECT_NE(gpu.err.find("backend: cuda"), std::string::npos) << gpu.err;
    EXPECT_EQ(gpu.err.find("CUDA is unavailable"), std::string::npos) << gpu.err;
    EXPECT_EQ(gpu.out, cpu.out) << "prompt " << ref.at("prompt");
    EXPECT_EQ(gpu.out, ref.at("completion").get<std::string>()) << "prompt " << ref.at("prompt");
  }
}

}  // namespace
}  // namespace troupe::test
