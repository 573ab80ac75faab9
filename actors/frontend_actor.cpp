#include "actors/stage_actors.hpp"
#include "runtime/frontend.hpp"
#include "runtime/messages.hpp"

namespace troupe {

caf::behavior frontend_actor(caf::event_based_actor* self, frontend* door) {
  return {
      [door](text_batch& batch) { door->post(std::move(batch)); },
      [door](request_failed& failed) { door->post(std::move(failed)); },
      [door](stats_answer& stats) { door->post(std::move(stats)); },
  };
}

}  // namespace troupe
