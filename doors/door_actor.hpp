#pragma once
// The doors' one actor: the stages send replies here and it hands each to the door its request
// came through (reply_router). Included only by the node (it pulls in CAF).

#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

namespace troupe {

class reply_router;

caf::behavior door_actor(caf::event_based_actor* self, reply_router* router);

}  // namespace troupe
