#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "engine/guided_vocabulary.hpp"
#include "engine/model_runner.hpp"
#include "engine/served_model.hpp"
#include "stages/message_inspect.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

caf::behavior worker_actor(caf::event_based_actor* self, std::shared_ptr<served_model> served,
                           worker_kv_settings kv) {
  keep_exception_in_exit_reason(self);
  auto runner = std::make_shared<model_runner>(*served->backend_model);
  auto endpoints = std::make_shared<kv_endpoints>();
  endpoints->served = served;
  kv_channel_settings channel;
  channel.bind_host = kv.bind_host;
  channel.keys = kv.keys;
  endpoints->sender = std::make_unique<kv_sender>(
      channel, kv_sender_events{[](uint64_t transfer_id, const std::string& why) {
        spdlog::warn("kv sender: transfer {} failed: {}", transfer_id, why);
      }});
  // The receiver reports on its own thread; the agent's mailbox brings it back to actor land. A
  // weak handle: the agent owns the receiver, which must not keep the agent alive.
  auto agent_slot = std::make_shared<caf::weak_actor_ptr>();
  auto report = [agent_slot](kv_arrival_msg arrival) {
    if (auto agent = agent_slot->lock()) caf::anon_send(caf::actor_cast<caf::actor>(agent), std::move(arrival));
  };
  endpoints->receiver = std::make_unique<kv_receiver>(
      *served->backend_model, channel,
      kv_receiver_events{
          [report](uint64_t transfer_id, int64_t request_id) { report(kv_arrival_msg{request_id, transfer_id, true, {}}); },
          [report](uint64_t transfer_id, int64_t request_id, const std::string& why) {
            report(kv_arrival_msg{request_id, transfer_id, false, why});
          }});
  runner->stream_kv_to(*endpoints->sender, kv.transfer_timeout);
  caf::actor agent = self->spawn<caf::linked>(kv_agent_actor, endpoints);
  *agent_slot = caf::actor_cast<caf::weak_actor_ptr>(agent);

  // Structured output masks tokens by their bytes; a model without EOS ids cannot end a
  // constrained output, so it serves none (the runner refuses such requests by name).
  if (served->tok && !served->eos_token_ids.empty()) {
    runner->set_vocabulary(make_token_vocabulary(*served->tok, served->backend_model->config().vocab_size,
                                                 served->eos_token_ids));
  }
  return instrumented(self, "worker", {
      [served, runner](step_plan& plan) -> step_done {
        step_done done;
        const timestamp_ns begin = steady_now_ns();
        try {
          done.result = runner->run(plan);
        } catch (const std::exception& e) {
          done.error = e.what();
          done.result.step_id = plan.step_id;
        }
        done.compute_ns = steady_now_ns() - begin;
        return done;
      },
      [served, agent](describe_atom) {
        return worker_description{served->base_engine_config(), served->eos_token_ids, describe(*served), agent};
      },
      [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
  });
}

caf::behavior worker_actor_from_spec(caf::event_based_actor* self, worker_spec spec) {
  keep_exception_in_exit_reason(self);
  auto served = load_served_model(spec.model);
  if (!served->device_note.empty()) {
    spdlog::log(spec.model.device == device_request::cuda ? spdlog::level::warn : spdlog::level::info, "{}",
                served->device_note);
  }
  spdlog::info("worker: {}", describe(*served));
  worker_kv_settings kv;
  kv.bind_host = spec.kv_bind_host;
  kv.transfer_timeout = std::chrono::milliseconds(spec.kv_transfer_timeout_ms);
  kv.keys = std::move(spec.kv_keys);
  return worker_actor(self, std::move(served), std::move(kv));
}

}  // namespace troupe
