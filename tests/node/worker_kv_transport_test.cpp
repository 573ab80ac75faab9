// A GPU KV transport is checked where the worker starts, on the node that owns the GPU (the
// controller's topology check sees only its own machine): a worker that cannot carry KV over the
// transport its spec names refuses to start, naming the transport and why, instead of serving
// the KV over zmq. Here (no GPU, or a model served from host memory) stories260K on the CPU is
// such a worker for cuda_ipc and nccl; zmq starts.

#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <chrono>
#include <string>
#include <variant>

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

// The worker spawned by name from its spec, as every node spawns one, and asked to describe
// itself (what the engine placer asks first): its description, or the error it refused with.
std::variant<worker_description, std::string> spawn_and_describe(caf::actor_system& system, const worker_spec& spec) {
  auto worker = system.spawn<worker_handle>("worker", caf::make_message(spec));
  if (!worker) return "cannot spawn: " + system.render(worker.error());
  std::variant<worker_description, std::string> out = std::string("no answer");
  caf::scoped_actor self(system);
  self->request(*worker, std::chrono::seconds(60), describe_atom::value)
      .receive([&](worker_description& d) { out = std::move(d); }, [&](caf::error& e) { out = system.render(e); });
  caf::anon_send_exit(*worker, caf::exit_reason::user_shutdown);
  return out;
}

TEST(worker_kv_transport, a_worker_that_cannot_carry_its_transport_refuses_to_spawn_naming_why) {
  TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf");
  caf::actor_system_config config;
  for_each_message_type(
      [&](auto type, const char* name) { config.add_message_type<typename decltype(type)::type>(name); });
  register_error_category(config);
  register_stage_types(config);
  caf::actor_system system(config);
  for (kv_transport transport : {kv_transport::cuda_ipc, kv_transport::nccl}) {
    SCOPED_TRACE(std::string(kv_transport_name(transport)));
    const auto answer = spawn_and_describe(system, cpu_worker(transport));
    ASSERT_TRUE(std::holds_alternative<std::string>(answer)) << "the worker started";
    const std::string& refusal = std::get<std::string>(answer);
    EXPECT_NE(refusal.find(expected_refusal(transport)), std::string::npos) << refusal;
    EXPECT_EQ(refusal.find("not driven"), std::string::npos) << "nccl is served: " << refusal;
  }
  const auto zmq = spawn_and_describe(system, cpu_worker(kv_transport::zmq));
  ASSERT_TRUE(std::holds_alternative<worker_description>(zmq)) << std::get<std::string>(zmq);
  EXPECT_GT(std::get<worker_description>(zmq).config.num_kv_blocks, 0);
}

}  // namespace
}  // namespace troupe::test
