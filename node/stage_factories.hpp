#pragma once
// Starting stages from their specs (stages/stage_specs.hpp), the one way every node does it: each
// registers the stage actors by name (register_stage_types), and a controller spawns its own
// stages through them as it spawns a node's remotely (node/node_link.hpp, spawn_on).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "engine/served_model.hpp"
#include "stages/stage_interfaces.hpp"
#include "stages/stage_specs.hpp"

namespace troupe {

// Told of each stage spawned by name (a controller's remote_spawn): its type name and its actor.
using stage_spawned_fn = std::function<void(const std::string& type, const caf::actor& stage)>;

// The names a controller remote-spawns stages under, each taking its spec as the one argument:
// "tokenizer" (tokenizer_spec), "scheduler" (scheduler_spec), "worker" (worker_spec, detached:
// it computes, so it owns a thread) and "detokenizer" (detokenizer_spec).
// A worker spawned by name gets `kv_keys` (this node's own KV channel keys, which no spec carries).
void register_stage_types(caf::actor_system_config& config, stage_spawned_fn on_spawn = {},
                          kv_channel_keys kv_keys = {});

}  // namespace troupe
