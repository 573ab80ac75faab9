#pragma once
// The controller's view of the whole cluster for `troupe inspect`: it asks its own node's
// inspector and every [[nodes]] entry's agent (which hands the question to that node's inspector,
// node/node_inspector.hpp) and answers with all of them together. Every wait is bounded and
// nothing blocks: a node that does not answer within `timeout` (or cannot be connected to within
// a second) is listed as unreachable with the reason, and a node that failed to connect is not
// tried again for a few seconds, so a dead node costs the view nothing but its row.
//
//   (inspect_atom) → std::string: a cluster_inspection as JSON (node/inspection.hpp), the
//                    controller first, then the nodes in topology order

#include <chrono>

#include <caf/actor.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

#include "node/topology.hpp"

namespace troupe {

// `t` outlives the actor (the node's topology); `local` is the controller's node inspector.
caf::behavior cluster_inspector_actor(caf::event_based_actor* self, const topology* t, caf::actor local,
                                      std::chrono::milliseconds timeout);

}  // namespace troupe
