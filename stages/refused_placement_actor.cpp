#include <caf/after.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "stages/error_category.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

caf::behavior refused_placement(caf::scheduled_actor* self, const std::string& stage, const std::string& reason) {
  spdlog::error("{}: refusing the placement: {}", stage, reason);
  const caf::error refusal =
      caf::make_error(error_code::unavailable, "this node cannot run the " + stage + ": " + reason);
  self->set_default_handler([self, refusal](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    // Soon after this answer: the placer has the reason; the stage has nothing else to do.
    caf::delayed_anon_send(caf::actor_cast<caf::actor>(self), std::chrono::milliseconds(200),
                           caf::exit_msg{self->address(), refusal});
    return refusal;
  });
  // No one asked (a placer gone before its question): end anyway.
  return {caf::after(std::chrono::seconds(30)) >> [self, refusal] { self->quit(refusal); }};
}

}  // namespace troupe
