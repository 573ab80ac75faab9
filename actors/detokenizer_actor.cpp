#include "actors/stage_actors.hpp"
#include "runtime/detokenize_stage.hpp"
#include "runtime/messages.hpp"

namespace troupe {

caf::behavior detokenizer_actor(caf::event_based_actor* self, std::shared_ptr<detokenize_stage> stage,
                                caf::actor frontend) {
  return {
      [=](token_batch& batch) { self->send(frontend, stage->run(std::move(batch))); },
  };
}

}  // namespace troupe
