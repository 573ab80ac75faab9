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

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

#include "engine/engine_config.hpp"

namespace troupe {

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

}  // namespace troupe
