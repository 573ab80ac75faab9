#include <spdlog/spdlog.h>

#include "engine/model_runner.hpp"
#include "engine/served_model.hpp"
#include "stages/message_inspect.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

caf::behavior worker_actor(caf::event_based_actor* self, std::shared_ptr<served_model> served) {
  keep_exception_in_exit_reason(self);
  auto runner = std::make_shared<model_runner>(*served->backend_model);
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
      [served](describe_atom) {
        return worker_description{served->base_engine_config(), served->eos_token_ids, describe(*served)};
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
  return worker_actor(self, std::move(served));
}

}  // namespace troupe
