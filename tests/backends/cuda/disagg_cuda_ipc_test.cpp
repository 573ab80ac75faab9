// kv_transport "cuda_ipc" served end to end on one GPU: a 1P1D `troupe launch` whose prefill and
// decode nodes are separate processes on the same device, the prefill worker copying each
// layer's KV into the decode side's pool through CUDA IPC and sending in-place frames, answers a
// mix of greedy and seeded requests (ZeroMQ and HTTP, streamed and not, prompts that share
// prefixes) exactly like a colocated `troupe serve` on that GPU; both workers log the transport,
// no transfer fails, and once idle no block, reservation or lease is left. Skips without a GPU.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/cuda/disagg_gpu_support.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

TEST(disagg_cuda_ipc, a_1p1d_launch_over_cuda_ipc_on_one_gpu_answers_like_one_process) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  scratch_dir dir;
  make_credentials(dir / "certs", {"controller", "prefill-a", "decode-a"});
  const std::vector<mixed_request> mix = request_mix(60, gpu_disagg_prompts, 8, 48, true, 3);

  const std::vector<outcome> expected = colocated_on_the_gpu(dir, mix);
  ASSERT_FALSE(HasFailure()) << "the colocated reference failed a request";

  topology_spec t = on_the_gpu();
  t.kv_transport = "cuda_ipc";
  t.max_num_batched_tokens = 16;  // most prompts stream out chunk by chunk
  t.credentials = dir / "certs";
  t.nodes = {{"prefill-a", free_port()}, {"decode-a", free_port()}};
  t.prefill = {"prefill-a"};
  t.decode = {"decode-a"};
  t.engines = {};
  controller_process launch(controller_process::kind::launch, t.write(dir / "1p1d.toml"), dir / "1p1d.log");
  expect_answers_like_colocated(launch, mix, expected);
  EXPECT_TRUE(launch.wait_for_log("worker: KV transport cuda_ipc", 2, 10s)) << "both workers name their transport";
  EXPECT_EQ(count_of(launch.log(), "lost its KV transfer"), 0) << "a KV transfer failed and was re-run";
  EXPECT_EQ(count_of(launch.log(), "kv stream:"), 0) << "a layer was not copied";
  if (HasFailure()) ADD_FAILURE() << "launch log:\n" << launch.log();
}

// On a machine with a GPU (the controller's check passes), a node's worker whose model is served
// from host memory cannot copy device to device: it refuses on its node and the launch stops at
// startup naming why, rather than serve the KV over zmq.
TEST(disagg_cuda_ipc, a_cpu_worker_asked_for_cuda_ipc_refuses_to_start_naming_why) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  scratch_dir dir;
  topology_spec t;
  t.device = "cpu";
  t.kv_transport = "cuda_ipc";
  t.credentials = dir / "certs";
  make_credentials(dir / "certs", {"controller", "prefill-a", "decode-a"});
  t.nodes = {{"prefill-a", free_port()}, {"decode-a", free_port()}};
  t.prefill = {"prefill-a"};
  t.decode = {"decode-a"};
  t.engines = {};
  try {
    controller_process launch(controller_process::kind::launch, t.write(dir / "cpu.toml"), dir / "cpu.log");
    ADD_FAILURE() << "a CPU worker started with kv_transport cuda_ipc";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("keeps its KV pool in host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::test::cluster
