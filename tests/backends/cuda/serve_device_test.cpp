// `troupe serve --device cuda` as clients use it: 16 concurrent greedy requests through the
// real binary, on the GPU in f32 with overlapped scheduling and GPU sampling, must get exactly
// the texts the CPU server gives. Skips without a GPU.

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

TEST(serve_device, cuda_f32_serves_what_the_cpu_serves) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "Zoo",
                                            "Lily wanted",
                                            "The little dog ran to the park",
                                            "Tom and Sam were best friends. One day",
                                            "A",
                                            "She looked at the sky"};
  std::vector<generate_request> requests;
  for (int i = 0; i < 16; ++i) {
    requests.push_back(greedy(prompts[i % prompts.size()], 8 + (i * 13) % 50));
    requests.back().id = "r" + std::to_string(i);
  }
  std::vector<completion> on_cpu, on_gpu;
  {
    serve_process cpu({"--device", "cpu", "--max-num-seqs", "16"});
    on_cpu = serve_together(cpu, requests);
  }
  {
    serve_process gpu({"--device", "cuda", "--dtype", "f32", "--async-scheduling", "on", "--max-num-seqs", "16"});
    on_gpu = serve_together(gpu, requests);
    client c = gpu.make_client();
    auto stats = wait_until_idle(c);
    EXPECT_EQ(stats.num_free_blocks, stats.num_total_blocks);
  }
  ASSERT_EQ(on_cpu.size(), on_gpu.size());
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    EXPECT_EQ(on_gpu[i].token_ids, on_cpu[i].token_ids) << "request " << i;
    EXPECT_EQ(on_gpu[i].text, on_cpu[i].text) << "request " << i;
    EXPECT_EQ(on_gpu[i].finish_reason, on_cpu[i].finish_reason) << "request " << i;
  }
}

}  // namespace
}  // namespace troupe::test
