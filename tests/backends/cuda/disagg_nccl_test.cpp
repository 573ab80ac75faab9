// kv_transport "nccl" served end to end on two GPUs: a 1P1D cluster whose prefill and decode nodes
// are separate processes, each on a GPU of its own (CUDA_VISIBLE_DEVICES; NCCL refuses two ranks
// on one GPU, "Duplicate GPU detected"), the prefill worker sending each layer's KV with ncclSend
// after its in-place frame and the decode side receiving it with ncclRecv on the pair's thread,
// answers a mix of greedy and seeded requests (ZeroMQ and HTTP, streamed and not, prompts that
// share prefixes, chunked prefills) exactly like a colocated `troupe serve` on one GPU; both
// workers log the transport, no transfer fails, and once idle no block, reservation or lease is
// left. Skips without two GPUs (two hosts are the real setting; two GPUs of one host run the same
// code over NCCL's P2P or shared-memory transport).

#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <stdlib.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/cuda/disagg_gpu_support.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// Sets CUDA_VISIBLE_DEVICES for the children started in its scope (a child reads it when it
// starts CUDA; this process started CUDA already, so it is not affected), and restores it.
class visible_device {
 public:
  explicit visible_device(int device) {
    if (const char* old = getenv("CUDA_VISIBLE_DEVICES")) old_ = old;
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(device).c_str(), 1);
  }
  ~visible_device() {
    if (old_) {
      setenv("CUDA_VISIBLE_DEVICES", old_->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
  visible_device(const visible_device&) = delete;
  visible_device& operator=(const visible_device&) = delete;

 private:
  std::optional<std::string> old_;
};

TEST(disagg_nccl, a_1p1d_cluster_over_nccl_on_two_gpus_answers_like_one_process) {
  TROUPE_REQUIRE_GPU();
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
#if !TROUPE_KV_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#endif
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "kv_transport nccl needs two GPUs (NCCL refuses two ranks on one)";
  scratch_dir dir;
  make_credentials(dir / "certs", {"controller", "prefill-a", "decode-a"});
  const std::vector<mixed_request> mix = request_mix(60, gpu_disagg_prompts, 8, 48, true, 3);

  const std::vector<outcome> expected = colocated_on_the_gpu(dir, mix);
  ASSERT_FALSE(HasFailure()) << "the colocated reference failed a request";

  std::deque<node_process> nodes;  // declared before the controller, which stops first
  {
    visible_device gpu0(0);
    nodes.emplace_back(dir / "certs", "prefill-a", free_port(), dir.path());
  }
  {
    visible_device gpu1(1);
    nodes.emplace_back(dir / "certs", "decode-a", free_port(), dir.path());
  }
  topology_spec t = on_the_gpu();
  t.kv_transport = "nccl";
  t.max_num_batched_tokens = 16;  // most prompts stream out chunk by chunk
  t.credentials = dir / "certs";
  t.nodes = {nodes[0].entry(), nodes[1].entry()};
  t.prefill = {"prefill-a"};
  t.decode = {"decode-a"};
  t.engines = {};
  controller_process controller(controller_process::kind::serve, t.write(dir / "1p1d.toml"), dir / "1p1d.log");
  expect_answers_like_colocated(controller, mix, expected);
  const std::string node_logs = nodes[0].log() + nodes[1].log();
  EXPECT_EQ(count_of(node_logs, "worker: KV transport nccl"), 2) << "both workers name their transport";
  EXPECT_EQ(count_of(controller.log() + node_logs, "lost its KV transfer"), 0) << "a KV transfer failed and was re-run";
  EXPECT_EQ(count_of(node_logs, "kv stream:"), 0) << "a layer was not sent";
  EXPECT_EQ(count_of(node_logs, "nccl kv inbox: the pair"), 0) << "a pair broke";
  if (HasFailure()) ADD_FAILURE() << "controller log:\n" << controller.log() << "\nnode logs:\n" << node_logs;
}

}  // namespace
}  // namespace troupe::test::cluster
