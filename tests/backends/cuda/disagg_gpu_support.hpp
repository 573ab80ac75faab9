#pragma once
// What the GPU 1P1D tests share (disagg_cuda_ipc_test, disagg_nccl_test): the prompts, the
// topology on the GPU, the colocated server's answers as the reference, and the check that a
// disaggregated cluster answered the same and left nothing held once idle.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {

inline const std::vector<std::string> gpu_disagg_prompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun",
    "Once upon a time, there was a little girl named Lily. She had a big red ball", "The little dog ran to the park",
    "Lily and Tom went to the park. They saw a big tree with a swing. Tom wanted to swing first", "One day, a bird"};

inline constexpr size_t gpu_disagg_wave = 20;

inline topology_spec on_the_gpu() {
  topology_spec t;
  t.device = "cuda";
  t.dtype = "f32";  // the CPU-exact precision: batches that differ between the topologies give the same tokens
  return t;
}

// The answers of a colocated `troupe serve` on the GPU; a request it failed is a test failure.
inline std::vector<outcome> colocated_on_the_gpu(const troupe::testing::scratch_dir& dir,
                                                 const std::vector<mixed_request>& mix) {
  controller_process reference(controller_process::kind::serve, on_the_gpu().write(dir / "colocated.toml"),
                               dir / "colocated.log");
  std::vector<outcome> expected = run_in_waves(reference, mix, gpu_disagg_wave);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(expected[i].error, "") << "reference " << i;
  return expected;
}

// `cluster` answered `mix` as the reference did, and once idle holds no block, reservation or
// lease.
inline void expect_answers_like_colocated(controller_process& cluster, const std::vector<mixed_request>& mix,
                                          const std::vector<outcome>& expected) {
  const std::vector<outcome> got = run_in_waves(cluster, mix, gpu_disagg_wave);
  int num_different = 0;
  for (size_t i = 0; i < mix.size(); ++i) {
    if (same_output(got[i], expected[i])) continue;
    if (++num_different <= 5) ADD_FAILURE() << "request " << i << ": " << got[i] << " != " << expected[i];
  }
  EXPECT_EQ(num_different, 0) << "of " << mix.size();
  const stats_reply idle = wait_until_idle(cluster);
  EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks) << "a KV block left taken";
  EXPECT_EQ(idle.num_waiting_for_kv, 0) << "a reservation left";
  EXPECT_EQ(idle.num_kv_leases, 0) << "a KV transfer left open";
}

}  // namespace troupe::test::cluster
