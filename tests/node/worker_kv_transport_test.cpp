// A GPU KV transport is checked where the worker starts, on the node that owns the GPU (the
// controller's topology check sees only its own machine): a worker that cannot carry KV over the
// transport its spec names refuses to start, naming the transport and why, instead of serving
// the KV over zmq. Here (no GPU, or a model served from host memory) stories260K on the CPU is
// such a worker for cuda_ipc and nccl; zmq starts.

#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <string>

#include "node/stage_factories.hpp"
#include "stages/error_category.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_actors.hpp"
#include "tests/shared_models.hpp"

namespace troupe::test {
namespace {

worker_spec cpu_worker(kv_transport transport) {
  worker_spec spec;
  spec.model.path = (stories260k_dir / "hf").string();
  spec.model.device = device_request::cpu;
  spec.model.kv_memory_mb = 4;
  spec.kv_transport = transport;
  return spec;
}

// What this machine answers for a worker whose pool is in host memory.
std::string expected_refusal(kv_transport transport) {
  const std::string named = "kv_transport \"" + std::string(kv_transport_name(transport)) + "\" ";
  const std::string why = kv_transport_unavailable(transport);
  return why.empty() ? named + "copies KV in GPU memory, and backend cpu keeps its KV pool in host memory"
                     : named + "cannot run on this node: " + why;
}

TEST(worker_kv_transport, a_worker_that_cannot_carry_its_transport_refuses_to_spawn_naming_why) {
  TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf");
  caf::actor_system_config config;
  for_each_message_type(
      [&](auto type, const char* name) { config.add_message_type<typename decltype(type)::type>(name); });
  register_error_category(config);
  caf::actor_system system(config);
  for (kv_transport transport : {kv_transport::cuda_ipc, kv_transport::nccl}) {
    SCOPED_TRACE(std::string(kv_transport_name(transport)));
    try {
      spawn_worker(system, cpu_worker(transport));
      ADD_FAILURE() << "the worker spawned";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected_refusal(transport)), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("not driven"), std::string::npos) << "nccl is served: " << e.what();
    }
  }
  spawned_worker zmq = spawn_worker(system, cpu_worker(kv_transport::zmq));
  ASSERT_TRUE(zmq.actor);
  caf::anon_send_exit(zmq.actor, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::test
