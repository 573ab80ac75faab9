#include <caf/event_based_actor.hpp>

#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/scheduler_stage.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

caf::behavior scheduler_actor(caf::event_based_actor* self, engine_config config,
                              std::vector<int32_t> eos_token_ids, caf::actor worker, caf::actor router) {
  keep_exception_in_exit_reason(self);
  auto stage = std::make_shared<scheduler_stage>(config, std::move(eos_token_ids));
  // Delivers a stage call's outputs: the next plan first, so the worker starts computing while
  // the deltas travel to the detokenizer.
  auto deliver = std::make_shared<std::function<void(scheduler_stage::outputs)>>();
  *deliver = [=](scheduler_stage::outputs out) {
    // With async scheduling two plans may go out; the worker answers them in order.
    for (step_plan& plan : out.plans) {
      const uint64_t step_id = plan.step_id;
      self->request(worker, caf::infinite, std::move(plan)).then(
          [=](step_done& done) { const auto timed = timed_response(self); (*deliver)(stage->step_finished(done)); },
          [=](caf::error& error) {
            step_done failed;
            failed.result.step_id = step_id;
            failed.error = "worker unreachable: " + self->system().render(error);
            (*deliver)(stage->step_finished(failed));
          });
    }
    if (!out.tokens.empty()) {
      out.tokens.load = stage->load();
      self->send(router, std::move(out.tokens));
    }
    for (auto& refusal : out.refusals) self->send(router, std::move(refusal));
  };
  self->attach_functor([deliver] { *deliver = nullptr; });  // breaks the self-reference cycle
  return instrumented(self, "scheduler", {
      [=](schedule_request& request) { (*deliver)(stage->add(std::move(request))); },
      [=](abort_request_msg& abort) { (*deliver)(stage->abort(abort.request_id)); },
      [=](stop_request_msg& stop) { (*deliver)(stage->stop(stop.request_id)); },
      [=](stats_query& query) -> stats_answer { return stage->stats(query.tag); },
      [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
  });
}

caf::behavior scheduler_actor_from_spec(caf::event_based_actor* self, scheduler_spec spec) {
  keep_exception_in_exit_reason(self);
  spec.validate();
  // One instance: the worker goes with its scheduler, and both go with the controller's router
  // (a lost controller would leave them holding the model and the KV pool for no one).
  self->link_to(spec.worker);
  quit_with(self, spec.router);
  return scheduler_actor(self, spec.config, std::move(spec.eos_token_ids), std::move(spec.worker),
                         std::move(spec.router));
}

}  // namespace troupe
