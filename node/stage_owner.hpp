#pragma once
// Which controller a stage on a node works for. After spawning a stage on a node, the controller
// tells the node's agent (stage_owner_atom, stage, owner), `owner` being its presence actor. The
// agent watches the owner: once the controller's process is gone (killed, or its connection
// lost), CAF reports the owner down and the node stops every stage that controller placed. A
// restarted controller that takes the node back then finds it empty, instead of its new stages
// running beside stale ones that still hold their model and KV memory and serve no one.

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>

namespace troupe {

using stage_owner_atom = caf::atom_constant<caf::atom("stgowner")>;

// The controller's presence: one per controller, spawned and stopped with its other actors
// (node/node.cpp). It does nothing but exist while the controller does.
caf::behavior controller_presence(caf::event_based_actor* self);

}  // namespace troupe
