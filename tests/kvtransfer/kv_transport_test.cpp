// [disaggregation] kv_transport's values: names round-trip, an unknown one is refused naming the
// choices, and a GPU transport says why it cannot run where it cannot (this build, no GPU).

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kvtransfer/kv_transport.hpp"

namespace troupe {
namespace {

TEST(kv_transport, names_round_trip_and_an_unknown_one_is_refused_with_the_choices) {
  for (kv_transport t : {kv_transport::zmq, kv_transport::cuda_ipc, kv_transport::nccl}) {
    EXPECT_EQ(parse_kv_transport(kv_transport_name(t)), t);
  }
  try {
    parse_kv_transport("rdma");
    ADD_FAILURE() << "accepted \"rdma\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"rdma\" is not one of \"zmq\", \"cuda_ipc\", \"nccl\""), std::string::npos)
        << e.what();
  }
}

TEST(kv_transport, zmq_runs_everywhere_and_a_gpu_transport_says_why_it_cannot_run) {
  EXPECT_EQ(kv_transport_unavailable(kv_transport::zmq), "");
  for (kv_transport t : {kv_transport::cuda_ipc, kv_transport::nccl}) {
    const std::string why = kv_transport_unavailable(t);
#if !TROUPE_KV_CUDA
    EXPECT_EQ(why, "this build has no CUDA (nvcc was not found when it was configured)");
#else
    // With CUDA built in, the answer depends on the machine: a GPU (then NCCL's presence decides
    // for nccl) or the runtime's reason for none.
    if (!why.empty()) {
      EXPECT_TRUE(why.starts_with("no GPU answers: ") || why.starts_with("this build has no NCCL")) << why;
    }
#endif
  }
}

}  // namespace
}  // namespace troupe
