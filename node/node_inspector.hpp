#pragma once
// A node's inspector: one actor on every node (the controller and each `troupe node`) that reads
// the statistics of the node's instrumented actors (stages/instrumented_actor.hpp) and asks each
// of its schedulers for its KV usage, running and waiting counts, each within a bound; a
// scheduler that does not answer in time is listed with an error, never waited for longer.
//
//   (inspect_atom) → std::string: this node's node_inspection as JSON (node/inspection.hpp)
//
// A `troupe node`'s agent hands the controller's (inspect_atom) to it (node/remote_node.cpp); the
// controller's cluster inspector asks every node's (node/cluster_inspector.hpp).

#include <chrono>
#include <string>

#include <caf/atom.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

namespace troupe {

using inspect_atom = caf::atom_constant<caf::atom("inspect")>;

caf::behavior node_inspector_actor(caf::event_based_actor* self, std::string node, std::chrono::milliseconds timeout);

}  // namespace troupe
