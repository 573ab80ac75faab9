// A server on the CPU does not carry the GPU's libraries: cuBLASLt (176 MiB resident, its pages and
// its initialisation, when it was linked) is loaded only when a model runs on CUDA
// (backends/cuda/cublaslt_library.hpp).
// The check reads the running server's memory map.

#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

TEST(cpu_process_libraries, a_cpu_server_that_has_served_maps_no_cublas) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "hf" / "config.json");
  serve_process server({"--device", "cpu"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  generate_request request;
  request.prompt = "Once upon a time";
  request.sampling.max_tokens = 8;
  EXPECT_EQ(c.generate(request).token_ids.size(), 8u);
  const std::string maps = read_file("/proc/" + std::to_string(server.pid()) + "/maps");
  ASSERT_FALSE(maps.empty()) << "cannot read the server's memory map";
  EXPECT_NE(maps.find("/troupe"), std::string::npos) << "not the server's map";
  EXPECT_EQ(maps.find("libcublasLt"), std::string::npos) << "cuBLASLt is mapped in a CPU-only server";
  EXPECT_EQ(maps.find("libcublas.so"), std::string::npos) << "cuBLAS is mapped in a CPU-only server";
}

}  // namespace
}  // namespace troupe::test
