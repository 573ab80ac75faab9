// `troupe generate --device cuda` as a user runs it: the real binary on stories260K in f32 must
// print exactly what the CPU backend prints, greedy, for every reference prompt. Skips without
// a GPU (the GPU-less fallback is checked by tests/e2e/generate_e2e_test.cpp).

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cuda/cuda_test_util.hpp"

namespace troupe {
namespace {

std::filesystem::path shared_dir() {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  return env ? env : TROUPE_SHARED_DIR;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct run_result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

run_result run_troupe(const std::string& args) {
  const auto err_path = std::filesystem::temp_directory_path() / ("troupe_cuda_generate_" + std::to_string(::getpid()) + ".err");
  const std::string binary = std::string(TROUPE_BINARY_DIR) + "/bin/troupe";
  const std::string command = shell_quote(binary) + " " + args + " 2>" + shell_quote(err_path.string());
  run_result r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

TEST(generate_device, cuda_f32_prints_what_the_cpu_prints) {
  TROUPE_REQUIRE_GPU();
  const std::filesystem::path stories = shared_dir() / "models" / "stories260K";
  if (!std::filesystem::exists(stories / "refs.json")) GTEST_SKIP() << "no stories260K at " << stories;
  if (!std::filesystem::exists(std::string(TROUPE_BINARY_DIR) + "/bin/troupe")) GTEST_SKIP() << "troupe is not built";
  std::ifstream in(stories / "refs.json");
  const auto refs = nlohmann::json::parse(in).at("references");
  for (const auto& ref : refs) {
    const std::string args = "generate --model " + shell_quote((stories / "hf").string()) + " --prompt " +
                             shell_quote(ref.at("prompt").get<std::string>()) + " --temperature 0 --threads 1 --max-tokens " +
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
}  // namespace troupe
