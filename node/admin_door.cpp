#include "node/admin_door.hpp"

#include <memory>
#include <set>
#include <stdexcept>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "node/cluster_inspector.hpp"
#include "node/node_inspector.hpp"
#include "node/remote_node.hpp"
#include "node/tls_middleman.hpp"
#include "stages/error_category.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

// A scheduler's stats answer within a node, and a node's whole answer: `troupe inspect` refreshes
// every second, so neither may wait long for a stage or node that is stuck or gone.
constexpr std::chrono::milliseconds node_inspect_timeout{500};
constexpr std::chrono::milliseconds cluster_inspect_timeout{1500};

// Detached: placing an instance blocks while the node loads the model.
caf::behavior admin_actor(caf::event_based_actor* self, engine_placer* placer, router_handle router,
                          std::function<void()> on_added, caf::actor inspector, int max_added) {
  self->link_to(inspector);  // the cluster's inspector goes with the door
  // The instances this door added and has not drained: each holds a model and a KV pool on its
  // node, so an unbounded `scale --add` loop exhausted a node's memory (issue 25).
  auto added = std::make_shared<std::set<engine_instance_id>>();
  return instrumented(
      self, "admin",
      {
          [=](scale_add_atom, const std::string& node, const std::string& role_name) -> caf::result<std::string> {
            if (static_cast<int>(added->size()) >= max_added) {
              spdlog::warn("admin: refused to add an engine instance on {}: {} added already", node, added->size());
              return caf::make_error(error_code::overloaded,
                                     "this controller has added " + std::to_string(added->size()) +
                                         " engine instances already, its [cluster] max_added_instances (" +
                                         std::to_string(max_added) + "): drain one of them first");
            }
            spdlog::info("admin: adding a {} engine instance on {}", role_name, node);
            engine_role role = engine_role::mixed;
            try {
              role = parse_engine_role(role_name);
            } catch (const std::exception& e) {
              spdlog::warn("admin: adding an engine instance on {} failed: {}", node, e.what());
              return caf::make_error(error_code::bad_request, std::string(e.what()));
            }
            try {
              placed_engine placed = placer->place(node, role);
              added->insert(placed.id);
              if (on_added) on_added();
              const std::string kind = role == engine_role::mixed ? "" : std::string(engine_role_name(role)) + " ";
              return kind + "engine instance " + std::to_string(placed.id) + " on " + node;
            } catch (const std::exception& e) {
              // The node is unknown, unreachable or refused the placement (no room for the model).
              spdlog::warn("admin: adding an engine instance on {} failed: {}", node, e.what());
              return caf::make_error(error_code::unavailable, std::string(e.what()));
            }
          },
          [=](drain_engine_atom drain, engine_instance_id id) -> caf::result<bool> {
            auto promise = self->make_response_promise<bool>();
            self->request(router, caf::infinite, drain, id)
                .then(
                    [=](bool draining) mutable {
                      if (draining) added->erase(id);  // its node frees it with its last request
                      promise.deliver(draining);
                    },
                    [=](caf::error& error) mutable { promise.deliver(std::move(error)); });
            return promise;
          },
          [=](drain_node_atom drain, const std::string& node,
              int32_t deadline_ms) -> caf::result<std::vector<int32_t>> {
            auto promise = self->make_response_promise<std::vector<int32_t>>();
            spdlog::info("admin: draining node {}", node);
            self->request(router, caf::infinite, drain, node, deadline_ms)
                .then(
                    [=](std::vector<int32_t>& draining) mutable {
                      for (int32_t id : draining) added->erase(id);
                      promise.deliver(std::move(draining));
                    },
                    [=](caf::error& error) mutable { promise.deliver(std::move(error)); });
            return promise;
          },
          [=](list_engines_atom list) { return self->delegate(router, list); },
          [=](inspect_atom inspect) { return self->delegate(inspector, inspect); },
      });
}

}  // namespace

caf::actor spawn_cluster_inspector(caf::actor_system& system, const topology& t) {
  auto local = system.spawn(node_inspector_actor, t.cluster.name, node_inspect_timeout);
  return system.spawn(cluster_inspector_actor, &t, std::move(local), cluster_inspect_timeout);
}

caf::actor open_admin_door(caf::actor_system& system, const topology& t, engine_placer* placer, router_handle router,
                           std::function<void()> on_added, caf::actor inspector) {
  remote_node_options where;
  parse_listen_address(t.cluster.admin_listen, where);
  auto admin = system.spawn<caf::detached>(admin_actor, placer, std::move(router), std::move(on_added), inspector,
                                           t.cluster.max_added_instances);
  auto bound = tls_publish(system, admin, where.port, where.host);
  if (!bound) {
    caf::anon_send_exit(admin, caf::exit_reason::user_shutdown);
    throw std::runtime_error("[cluster] admin_listen " + t.cluster.admin_listen +
                             ": cannot listen: " + system.render(bound.error()));
  }
  spdlog::info("admin door on {}:{}", where.host, *bound);
  return admin;
}

}  // namespace troupe
