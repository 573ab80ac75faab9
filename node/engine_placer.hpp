#pragma once
// Engine instances (a worker and its scheduler, always together on one node) placed where the
// topology or `troupe scale` says, and added to the router. A remote instance that is lost is
// placed again on its node by a keeper thread, every [cluster] reconnect_interval_ms until the
// node answers: a node that comes back (restarted on its address) restores service without a
// restart of the controller. An instance on the controller is not replaced: a stage that fails
// in the controller's own process takes the node out of service (node.cpp). A lost tokenizer pool
// or detokenizer on a node is re-placed by the same keeper, through the node's stage_restorer.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "engine/served_model.hpp"
#include "node/node_link.hpp"
#include "node/topology.hpp"
#include "stages/engine_router.hpp"
#include "stages/stage_specs.hpp"

namespace troupe {

struct placed_engine {
  engine_instance_id id = 0;
  std::string node;
  engine_role role = engine_role::mixed;
  worker_description description;
  worker_handle worker;
  scheduler_handle scheduler;
};

class engine_placer {
 public:
  // `owner`: the controller's presence actor, named to nodes as its stages' owner (node_link).
  engine_placer(caf::actor_system& system, const topology& t, caf::actor owner = {});
  ~engine_placer();  // stops the keeper
  engine_placer(const engine_placer&) = delete;
  engine_placer& operator=(const engine_placer&) = delete;

  // The router new instances join; set once, before the first place().
  void set_router(router_handle router) { router_ = std::move(router); }

  // Places one instance on `node` (a [[nodes]] name, or the controller's own name), waits until
  // its worker has loaded the model, and adds it to the router. Throws std::runtime_error naming
  // the node and what failed.
  placed_engine place(const std::string& node, engine_role role = engine_role::mixed);

  // A stage of `kind` ("engine", "tokenizer" or "detokenizer"; an engine of another role than
  // mixed is "prefill" or "decode") on `node` was lost: place a new one there as soon as the
  // node answers again. Does not block (called from actors' threads). An engine on the
  // controller's own name is ignored.
  void place_again_later(const std::string& node, const std::string& kind = "engine");

  // How a lost tokenizer pool or detokenizer is placed again (the node knows their specs and
  // who uses them); throws when the node does not answer yet. Set before serving starts.
  using stage_restorer = std::function<void(const std::string& kind, const std::string& node)>;
  void set_stage_restorer(stage_restorer restore) { restore_ = std::move(restore); }

  // Stops the keeper (a placement under way is cancelled); before the actor system goes.
  void stop();

 private:
  void keep();
  scheduler_spec scheduler_for(const worker_description& description, worker_handle worker) const;
  worker_spec worker_for(const std::string& node, engine_role role) const;

  caf::actor_system& system_;
  const topology& topology_;
  node_link link_;
  router_handle router_;
  std::mutex mutex_;
  std::condition_variable wake_;
  stage_restorer restore_;
  // Guarded by mutex_: (kind, node), one entry per stage to re-place.
  std::multiset<std::pair<std::string, std::string>> lost_;
  std::atomic<bool> stopping_{false};
  std::thread keeper_;
};

}  // namespace troupe
