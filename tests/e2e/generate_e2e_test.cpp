// `troupe generate` as a user runs it: the real binary, the real stories260K model (HF and
// GGUF), greedy, compared with the reference continuations in refs.json.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backends/backend_selection.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {
namespace {

class generate_e2e : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  }
  std::string model_arg() const { return "--model " + shell_quote((stories_root / GetParam()).string()); }
};

TEST_P(generate_e2e, greedy_text_matches_the_references) {
  for (const auto& ref : stories_references()) {
    const std::string prompt = ref.at("prompt").get<std::string>();
    const int max_new = ref.at("max_new_tokens").get<int>();
    run_result r = run_troupe("generate " + model_arg() + " --prompt " + shell_quote(prompt) +
                              " --temperature 0 --threads 1 --max-tokens " + std::to_string(max_new));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, ref.at("completion").get<std::string>()) << "prompt " << prompt;
    const size_t num_prompt = ref.at("input_ids").size();
    EXPECT_NE(r.err.find("prompt tokens: " + std::to_string(num_prompt) + ","), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("generated tokens: " + std::to_string(max_new) + ","), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("prompt tokens/s: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("generated tokens/s: "), std::string::npos) << r.err;
  }
}

TEST_P(generate_e2e, seeded_sampling_is_reproducible) {
  const std::string base = "generate " + model_arg() +
                           " --prompt 'Once upon a time' --temperature 1.0 --top-p 0.95 "
                           "--max-tokens 40 --threads 1 --seed ";
  run_result a = run_troupe(base + "7");
  run_result b = run_troupe(base + "7");
  run_result c = run_troupe(base + "8");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_FALSE(a.out.empty());
}

TEST_P(generate_e2e, stop_id_ends_generation_without_printing_it) {
  // The greedy "Zoo" continuation's 4th token is 298 ("gir", of " girl"); stop there.
  run_result r =
      run_troupe("generate " + model_arg() + " --prompt Zoo --temperature 0 --stop-id 298 --threads 1 --max-tokens 60");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, " was a little");
  EXPECT_NE(r.err.find("generated tokens: 4,"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("finish: stop"), std::string::npos) << r.err;
}

TEST_P(generate_e2e, device_cuda_is_the_gpu_or_an_error_and_auto_falls_back) {
  // --device cuda runs on a GPU or stops, saying why; --device auto falls back to the CPU and
  // says so on stderr. Either way, f32 gives the greedy references.
  const bool gpu = choose_device(device_request::auto_detect).kind == device_kind::cuda;
  const auto refs = stories_references();
  const auto& ref = refs.at(0);
  const std::string args = " --dtype f32 --prompt " + shell_quote(ref.at("prompt").get<std::string>()) +
                           " --temperature 0 --threads 1 --max-tokens " +
                           std::to_string(ref.at("max_new_tokens").get<int>());
  run_result cuda = run_troupe("generate " + model_arg() + " --device cuda" + args);
  run_result automatic = run_troupe("generate " + model_arg() + " --device auto" + args);
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  EXPECT_EQ(automatic.out, ref.at("completion").get<std::string>());
  if (gpu) {
    ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
    EXPECT_EQ(cuda.out, ref.at("completion").get<std::string>());
    EXPECT_NE(cuda.err.find("backend: cuda"), std::string::npos) << cuda.err;
  } else {
    EXPECT_NE(cuda.exit_code, 0) << cuda.out;
    EXPECT_NE(cuda.err.find("--device cuda: no usable GPU"), std::string::npos) << cuda.err;
    EXPECT_NE(automatic.err.find("running on the CPU"), std::string::npos) << automatic.err;
    EXPECT_NE(automatic.err.find("backend: cpu"), std::string::npos) << automatic.err;
  }
}

INSTANTIATE_TEST_SUITE_P(formats, generate_e2e, ::testing::Values("hf", "gguf/stories260K-f32.gguf"),
                         [](const auto& info) { return info.param == "hf" ? std::string("hf") : std::string("gguf"); });

// spdlog (which reports the error) may write to either stream.
std::string all_output(const run_result& r) { return r.out + r.err; }

TEST(generate_cli, the_prompt_runs_on_openblas_kernels_that_fit_the_cpu) {
  // OpenBLAS gives a CPU its build does not know SSE3 kernels (backends/cpu/blas_core.hpp);
  // troupe starts over with ones that fit, unless the user chose with OPENBLAS_CORETYPE.
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  const std::string args = " generate --model " + shell_quote(stories_dir) + " --prompt Zoo --max-tokens 2 --threads 1";
  run_result r = run_command("env -u OPENBLAS_CORETYPE " + shell_quote(troupe_binary.string()) + args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(", OpenBLAS "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("below this CPU"), std::string::npos) << r.err;
}

TEST(generate_cli, refuses_bad_usage_with_a_message) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  const std::string model = "--model " + shell_quote(stories_dir);
  run_result none = run_troupe("generate " + model);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(all_output(none).find("--prompt"), std::string::npos) << all_output(none);
  run_result chat = run_troupe("generate " + model + " --chat hello");
  EXPECT_NE(chat.exit_code, 0);
  EXPECT_NE(all_output(chat).find("chat_template"), std::string::npos) << all_output(chat);
  run_result bad = run_troupe("generate " + model + " --prompt hi --top-p 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(all_output(bad).find("top_p"), std::string::npos) << all_output(bad);
  run_result device = run_troupe("generate " + model + " --prompt hi --device tpu");
  EXPECT_NE(device.exit_code, 0);
  EXPECT_NE(all_output(device).find("--device"), std::string::npos) << all_output(device);
}

}  // namespace
}  // namespace troupe::test
