#include <caf/event_based_actor.hpp>

#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/scheduler_stage.hpp"
#include "stages/stage_clock.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {
// How often requests waiting for a lost pipeline stage look again: well under a restart's time.
constexpr std::chrono::milliseconds pipeline_tick_interval{50};
}  // namespace

scheduler_handle::behavior_type scheduler_actor(scheduler_handle::pointer self, engine_config config,
                                                std::vector<int32_t> eos_token_ids, worker_handle worker,
                                                router_handle router, kv_agent_handle kv_agent,
                                                std::chrono::milliseconds kv_transfer_timeout,
                                                std::chrono::milliseconds pipeline_failover_wait) {
  keep_exception_in_exit_reason(self);
  auto stage = std::make_shared<scheduler_stage>(config, std::move(eos_token_ids), pipeline_failover_wait);
  // While requests wait for a lost pipeline stage, a tick now and then times them out and plans
  // once the stage is back (nothing else would wake this actor then).
  auto tick_pending = std::make_shared<bool>(false);
  // Delivers a stage call's outputs: the next plan first, so the worker starts computing while
  // the deltas travel to the detokenizer.
  auto deliver = std::make_shared<std::function<void(scheduler_stage::outputs)>>();
  *deliver = [=](scheduler_stage::outputs out) {
    // With async scheduling two plans may go out; the worker answers them in order.
    for (step_plan& plan : out.plans) {
      const uint64_t step_id = plan.step_id;
      self->request(worker, caf::infinite, std::move(plan))
          .then(
              [=](step_done& done) {
                const auto timed = timed_response(self);
                (*deliver)(stage->step_finished(done));
              },
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
    // Disaggregation: the agent registers each reservation with the receiver and says where the
    // prefill side must send; the router passes that on.
    for (kv_reservation& reservation : out.kv_reservations) {
      const int64_t request_id = reservation.request_id;
      const uint64_t transfer_id = reservation.transfer_id;
      self->request(kv_agent, kv_transfer_timeout,
                    kv_expect_msg{std::move(reservation), static_cast<int32_t>(kv_transfer_timeout.count())})
          .then([=](kv_ready_msg& ready) { self->send(router, std::move(ready)); },
                [=](caf::error& error) {
                  (*deliver)(stage->kv_arrived(
                      kv_arrival_msg{request_id, transfer_id, false,
                                     "the KV agent did not take the transfer: " + self->system().render(error)}));
                });
    }
    for (uint64_t transfer_id : out.kv_cancels) self->send(kv_agent, kv_cancel_msg{transfer_id});
    for (kv_failed_msg& failure : out.kv_failures) self->send(router, std::move(failure));
    for (kv_arrival_msg& landed : out.kv_landed) self->send(router, std::move(landed));
    if (stage->waiting_for_pipeline() && !*tick_pending) {
      *tick_pending = true;
      self->delayed_send(self, pipeline_tick_interval, pipeline_tick_atom::value);
    }
  };
  self->attach_functor([deliver] { *deliver = nullptr; });  // breaks the self-reference cycle
  return instrumented(self, "scheduler",
                      {
                          [=](schedule_request& request) { (*deliver)(stage->add(std::move(request))); },
                          [=](abort_request_msg& abort) { (*deliver)(stage->abort(abort.request_id, abort.quietly)); },
                          [=](stop_request_msg& stop) { (*deliver)(stage->stop(stop.request_id)); },
                          [=](kv_arrival_msg& arrival) { (*deliver)(stage->kv_arrived(arrival)); },
                          [=](kv_handover_msg& handover) { (*deliver)(stage->hand_over(handover)); },
                          // The pool's numbers and the KV agent's open transfers: an idle instance has none of either.
                          [=](stats_query& query) -> caf::result<stats_answer> {
                            auto promise = self->make_response_promise<stats_answer>();
                            stats_answer answer = stage->stats(query.tag);
                            self->request(kv_agent, kv_transfer_timeout, kv_leases_atom::value)
                                .then(
                                    [=](kv_lease_counts& leases) mutable {
                                      answer.num_kv_leases = leases.num_expected + leases.num_sending;
                                      promise.deliver(answer);
                                    },
                                    [=](caf::error&) mutable { promise.deliver(answer); });
                            return promise;
                          },
                          [=](trace_query& query) -> trace_answer { return stage->trace(query); },
                          [=](pipeline_tick_atom) {
                            *tick_pending = false;
                            (*deliver)(stage->tick(steady_now_ns()));
                          },
                          [self](engine_instance_atom, int32_t instance) { name_engine_instance(self, instance); },
                          [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
                      });
}

scheduler_handle::behavior_type scheduler_actor_from_spec(scheduler_handle::pointer self, scheduler_spec spec) {
  keep_exception_in_exit_reason(self);
  spec.validate();
  // One instance: the worker goes with its scheduler, and both go with the controller's router
  // (a lost controller would leave them holding the model and the KV pool for no one).
  self->link_to(spec.worker);
  quit_with(self, spec.router);
  return scheduler_actor(self, spec.config, std::move(spec.eos_token_ids), std::move(spec.worker),
                         std::move(spec.router), std::move(spec.kv_agent),
                         std::chrono::milliseconds(spec.kv_transfer_timeout_ms),
                         std::chrono::milliseconds(spec.pipeline_failover_wait_ms));
}

}  // namespace troupe
