#pragma once
// The controller's admin door ([cluster] admin_listen): `troupe scale` adds an engine instance on
// a node while serving, drains one, or lists them. It is published over mutual TLS with the
// controller's certificate and the cluster's CA as the only trust anchor, so only a member of
// the cluster (a certificate the CA issued) gets an answer: the same bar as a node joining.
//
//   (scale_add_atom, node name, role)    → std::string: the new instance, "engine instance N on NODE"
//                                          ("prefill engine instance ..." for another role)
//                                          (role: "mixed", "prefill" or "decode"); an error once
//                                          [cluster] max_added_instances added ones are not drained
//   (drain_engine_atom, instance id)     → bool: false for an unknown id
//   (drain_node_atom, node, deadline ms) → std::vector<int32_t>: the instances on the node now
//                                          draining; past the deadline (> 0) those still busy are
//                                          taken out and their requests re-run elsewhere
//   (list_engines_atom)                  → std::vector<std::string>: one line per instance
//   (inspect_atom)                       → std::string: every node's actors and schedulers as JSON
//                                          (node/cluster_inspector.hpp, `troupe inspect`)

#include <functional>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

#include "node/engine_placer.hpp"
#include "node/topology.hpp"

namespace troupe {

using scale_add_atom = caf::atom_constant<caf::atom("scaleadd")>;

// Spawns the admin actor and publishes it on the topology's admin_listen; throws naming the
// address when it cannot listen. Logs `admin door on HOST:PORT` (the port chosen for port 0).
// `on_added` runs after each instance `troupe scale` adds (the node raises the doors' bound).
// The controller's cluster inspector (every node's actors, node/cluster_inspector.hpp): the admin
// door answers `troupe inspect` from it and /metrics renders its per-actor gauges.
caf::actor spawn_cluster_inspector(caf::actor_system& system, const topology& t);

caf::actor open_admin_door(caf::actor_system& system, const topology& t, engine_placer* placer, router_handle router,
                           std::function<void()> on_added, caf::actor inspector);

}  // namespace troupe
