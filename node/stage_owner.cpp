#include "node/stage_owner.hpp"

namespace troupe {

caf::behavior controller_presence(caf::event_based_actor*) {
  // It answers nothing a peer could send: its only use is to be watched.
  return {[](stage_owner_atom) {}};
}

}  // namespace troupe
