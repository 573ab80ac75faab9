#pragma once
// Per-actor statistics without code in any handler: `instrumented(self, "scheduler", {...})`
// wraps an actor's behaviour so that every message it dispatches is counted and timed, and the
// mailbox depth behind it sampled, into an actor_stats (stages/actor_stats.hpp) that the node's
// inspector reads (node/node_inspector.hpp). Included only by actors and the node (CAF).
//
// The statistics live in the actor system's registry, which exists when the system's config
// derives from actor_stats_host (both node configs do); an actor spawned in a system without one
// (a test's) runs its plain behaviour, unwrapped.
//
// What the wrapper sees: messages its behaviour matches. Responses to the actor's own requests
// (`request(...).then(...)`) bypass the behaviour in CAF 0.17; an actor whose main work arrives
// that way (the scheduler's step results) times that handler with `timed_response(self)`.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/actor_system.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/typed_behavior.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "plugins/plugin_chain.hpp"
#include "stages/actor_stats.hpp"

namespace troupe {

// The instrumented actors of one actor system (one node).
class actor_stats_registry {
 public:
  struct entry {
    std::string stage;      // "tokenizer", "router", "scheduler", "worker", "detokenizer", ...
    caf::actor_id id = 0;   // unique within the node
    caf::actor_addr actor;  // weak: the registry keeps no actor alive
    std::shared_ptr<actor_stats> stats;
    // The engine instance a scheduler or worker serves (the router's id, as `troupe scale
    // --list`, traces and logs name it); -1: not an engine's actor, or not told yet.
    int32_t instance = -1;
  };

  std::shared_ptr<actor_stats> add(std::string stage, caf::actor_id id, caf::actor_addr actor);
  void remove(caf::actor_id id);
  // Names the engine instance actor `id` serves; unknown ids: nothing.
  void set_instance(caf::actor_id id, int32_t instance);
  std::shared_ptr<actor_stats> find(caf::actor_id id) const;
  std::vector<entry> entries() const;  // in the order the actors started

  // A stage's plugins (plugins/plugin_chain), whose counters the inspector shows beside the
  // actors: held weakly, so they leave with the stage that owns them. A pool of tokenizers
  // sharing one chain registers it once.
  void add_plugins(std::string stage, std::weak_ptr<const plugin_chain> chain);
  // Each live chain's counters, one per plugin, with the stage that runs it.
  std::vector<std::pair<std::string, plugin_counters>> plugin_stage_counters() const;

 private:
  mutable std::mutex mutex_;
  std::vector<entry> entries_;                                                      // guarded by mutex_
  std::vector<std::pair<std::string, std::weak_ptr<const plugin_chain>>> plugins_;  // guarded by mutex_
};

// Registers `chain` (when it runs any plugin) with `system`'s registry, if it has one.
void register_plugins(caf::actor_system& system, std::string stage, const std::shared_ptr<const plugin_chain>& chain);

// Mixed into an actor_system_config to give the system a registry (node/node.cpp,
// node/remote_node.cpp).
class actor_stats_host {
 public:
  virtual ~actor_stats_host() = default;
  actor_stats_registry& stats_registry() const { return *registry_; }

 private:
  std::shared_ptr<actor_stats_registry> registry_ = std::make_shared<actor_stats_registry>();
};

// The registry of `system`, or null when its config is no actor_stats_host.
actor_stats_registry* stats_registry_of(caf::actor_system& system);

// Tells `self`'s entry which engine instance it serves (the router's engine_instance_atom).
void name_engine_instance(caf::scheduled_actor* self, int32_t instance);

// Registers `self` under `stage` and returns `inner` wrapped (or `inner` itself without a
// registry). The entry goes when the actor ends.
caf::behavior instrumented(caf::scheduled_actor* self, std::string stage, caf::behavior inner);
// The same for a typed stage (stages/stage_interfaces.hpp): `inner` is checked against the
// interface where it is written; the wrapper passes every message on to it unchanged.
template <class... Sigs>
caf::typed_behavior<Sigs...> instrumented(caf::typed_event_based_actor<Sigs...>* self, std::string stage,
                                          caf::typed_behavior<Sigs...> inner) {
  return {typename caf::typed_behavior<Sigs...>::unsafe_init{},
          instrumented(static_cast<caf::scheduled_actor*>(self), std::move(stage), std::move(inner.unbox()))};
}

// Times the scope it lives in as one handled message of `self` (a response handler's body):
// `[=](step_done& done) { auto timed = timed_response(self); ... }`. Does nothing for an actor
// that is not instrumented.
class response_timer {
 public:
  response_timer(std::shared_ptr<actor_stats> stats, int64_t mailbox_depth);
  ~response_timer();
  response_timer(const response_timer&) = delete;
  response_timer& operator=(const response_timer&) = delete;

 private:
  std::shared_ptr<actor_stats> stats_;
  int64_t depth_ = 0;
  timestamp_ns begin_ = 0;
};
response_timer timed_response(caf::scheduled_actor* self);

}  // namespace troupe
