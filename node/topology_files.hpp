#pragma once
// The files a topology names, checked before anything starts. A missing model path used to be
// found by the node that loaded it, after the other nodes had started and the controller had
// waited for its answer (30 s); now `troupe launch` checks the files of every member it starts on
// this machine, and the controller those of its own stages, and names every missing one at once.
// Members elsewhere check their own: a worker that cannot load its model refuses its placement
// with the reason (stages/worker_actor.cpp).

#include <set>
#include <string>
#include <vector>

#include "node/topology.hpp"

namespace troupe {

// Every file the stages placed on `members` (node names; the controller is t.cluster.name) would
// open that does not exist: "[model] path '/x' does not exist (the engines and tokenizers on n1)".
// Checked: [model] path (every stage kind reads it: weights or the tokenizer), [speculative]
// draft_model (engines), and each member's certificate, key and the cluster's CA in [cluster]
// credentials (a node always, the controller when it joins a cluster).
std::vector<std::string> missing_topology_files(const topology& t, const std::set<std::string>& members);

// Throws std::runtime_error naming `source` (the topology file) and every missing file.
void check_topology_files(const topology& t, const std::set<std::string>& members, const std::string& source);

}  // namespace troupe
