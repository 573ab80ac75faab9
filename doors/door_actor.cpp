#include "doors/door_actor.hpp"

#include "doors/reply_router.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"

namespace troupe {

caf::behavior door_actor(caf::event_based_actor* self, reply_router* router) {
  return instrumented(self, "frontend", {
      [router](text_batch& batch) { router->route(std::move(batch)); },
      [router](request_failed& failed) { router->route(std::move(failed)); },
      [router](stats_answer& stats) { router->route(std::move(stats)); },
      [router](trace_answer& trace) { router->route(std::move(trace)); },
  });
}

}  // namespace troupe
