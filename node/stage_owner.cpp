#include "node/stage_owner.hpp"

namespace troupe {

caf::behavior controller_presence(caf::event_based_actor*) {
  // Its only use is to be watched; CAF ends an actor whose behaviour is empty, so it keeps one
  // handler that does nothing.
  return {[](stage_owner_atom) {}};
}

}  // namespace troupe
