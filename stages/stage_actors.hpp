#pragma once
// The stage actors of a node. Each is a thin shell over a plain class: a message comes in, a call
// is made, messages go out. Included only by the actor files and the node (it pulls in CAF).
//
//   stage        | receives                                         | sends
//   tokenizer    | tokenize_request                                 | schedule_request / request_failed
//   scheduler    | schedule_request, abort_request_msg, stats_query | step_plan, token_batch, request_failed, stats_answer
//                | stop_request_msg                                 |
//   worker       | step_plan                                        | step_done (the response)
//   detokenizer  | token_batch                                      | text_batch, request_failed,
//                |                                                  | stop_request_msg (to the batch's sender)
//   every stage also takes a stage_failure_drill (node::fail_stage), which makes it throw.

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/behavior.hpp>
#include <caf/error.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/sec.hpp>

#include "engine/engine_config.hpp"
#include "stages/stage_specs.hpp"

namespace troupe {

// Makes an exception that escapes one of `self`'s handlers end the actor with the exception's
// message as its exit reason (CAF's default keeps only "runtime_error"), so the node's monitor
// can say what failed. Every stage actor calls it first.
inline void keep_exception_in_exit_reason(caf::event_based_actor* self) {
  self->set_exception_handler([](std::exception_ptr& thrown) -> caf::error {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
    } catch (...) {
      return caf::make_error(caf::sec::runtime_error, std::string("an exception that is not a std::exception"));
    }
  });
}

// A stage_failure_drill's handler: throws its reason, as a bug in the stage would.
inline void fail_for_drill(const std::string& reason) {
  throw std::runtime_error("failure drill: " + reason);
}

class tokenize_stage;
class detokenize_stage;
struct served_model;

// `frontend` below is the doors' actor (doors/door_actor.hpp): replies go there.

caf::behavior tokenizer_actor(caf::event_based_actor* self, std::shared_ptr<const tokenize_stage> stage,
                              caf::actor scheduler, caf::actor frontend);

// Owns the engine's scheduler; keeps one step in flight (two with async_scheduling) and plans
// the next one as soon as a result arrives. Never blocks.
caf::behavior scheduler_actor(caf::event_based_actor* self, engine_config config,
                              std::vector<int32_t> eos_token_ids, caf::actor worker,
                              caf::actor detokenizer, caf::actor frontend);

// Owns the model and its runner; spawned detached (it computes, so it gets its own thread).
caf::behavior worker_actor(caf::event_based_actor* self, std::shared_ptr<served_model> served);

caf::behavior detokenizer_actor(caf::event_based_actor* self, std::shared_ptr<detokenize_stage> stage,
                                caf::actor frontend);

// -- stages started from their specs (stages/stage_specs.hpp) -----------------------------------
// What a node registers for remote spawning and spawns for itself: each loads what its stage
// needs on the node where it runs, in the actor (a failed load or a bad spec ends the actor with
// a reason naming the file or field, which a monitor sees).

// Loads its own tokenizer (a pool spawned by one node shares one: node/stage_factories.hpp).
caf::behavior tokenizer_actor_from_spec(caf::event_based_actor* self, tokenizer_spec spec);
caf::behavior scheduler_actor_from_spec(caf::event_based_actor* self, scheduler_spec spec);
// Loads the model; spawn it detached (node/stage_factories.hpp does).
caf::behavior worker_actor_from_spec(caf::event_based_actor* self, worker_spec spec);
caf::behavior detokenizer_actor_from_spec(caf::event_based_actor* self, detokenizer_spec spec);

}  // namespace troupe
