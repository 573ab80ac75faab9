// `troupe quantize` as a user runs it: the real binary quantizes stories260K (HF directory and
// F32 GGUF), the file is what it says, `troupe generate` runs it and logs the weights' types and
// size at load, and bad arguments end with an error naming what is wrong.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model/loader/gguf_file.hpp"
#include "tests/e2e/e2e_support.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

class quantize_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "gguf/stories260K-f32.gguf");
  }
  testing::scratch_dir dir_;
};

TEST_F(quantize_e2e, a_quantized_file_is_written_loaded_and_logged) {
  const std::string out = (dir_ / "q8.gguf").string();
  run_result r = run_troupe("quantize " + shell_quote((stories_root / "gguf/stories260K-f32.gguf").string()) + " " +
                            shell_quote(out) + " --type q8_0 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("(Q8_0): q8_0: "), std::string::npos) << r.err;
  const gguf_file file = gguf_file::open(out);
  EXPECT_EQ(file.get_int("general.file_type"), 7);
  EXPECT_EQ(*file.find_tensor("blk.0.attn_q.weight")->element_type(), dtype::q8_0);
  EXPECT_EQ(*file.find_tensor("blk.0.attn_norm.weight")->element_type(), dtype::f32);

  // The HF directory gives the same weights (a dry run shows the plan without writing).
  run_result plan = run_troupe("quantize " + shell_quote(stories_dir) + " " + shell_quote((dir_ / "x.gguf").string()) +
                               " --type Q4_0 --dry-run");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("blk.4.ffn_down.weight"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("Q4_0: q4_0: "), std::string::npos) << plan.out;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.gguf"));

  run_result generated =
      run_troupe("generate --model " + shell_quote(out) + " --prompt Zoo --temperature 0 --threads 1 --max-tokens 8");
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_NE(generated.err.find("weights of '" + out + "' (Q8_0): q8_0: "), std::string::npos) << generated.err;
  EXPECT_NE(generated.err.find("MiB"), std::string::npos) << generated.err;
  EXPECT_FALSE(generated.out.empty());
}

TEST_F(quantize_e2e, bad_arguments_are_named) {
  const std::string in = shell_quote((stories_root / "gguf/stories260K-f32.gguf").string());
  run_result unknown = run_troupe("quantize " + in + " " + shell_quote((dir_ / "x.gguf").string()) + " --type Q7_K");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("unknown quantization type 'Q7_K'"), std::string::npos) << unknown.err;
  run_result missing = run_troupe("quantize " + shell_quote((dir_ / "none.gguf").string()) + " " +
                                  shell_quote((dir_ / "x.gguf").string()) + " --type Q8_0");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("none.gguf"), std::string::npos) << missing.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.gguf"));
}

}  // namespace
}  // namespace troupe::test
