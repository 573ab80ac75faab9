#pragma once
// The controller's way to a `troupe node`: connect to its agent over mutual TLS and spawn a stage
// there by name from its spec. Every wait is finite: a connection is retried until
// [cluster] connect_timeout_ms, a spawn (which loads what the stage needs) and any request after
// it wait at most request_timeout_ms. Errors name the node, its address and what failed.

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include <caf/actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/message.hpp>

#include "node/topology.hpp"

namespace troupe {

class node_link {
 public:
  // `owner`: the controller's presence actor, named to each node as the owner of the stages
  // spawned there (node/stage_owner.hpp); null: none named.
  node_link(caf::actor_system& system, const cluster_settings& settings, caf::actor owner = {})
      : system_(system), settings_(settings), owner_(std::move(owner)) {}

  // The node's agent; retries a refused connection (a node still starting) until the deadline,
  // or until `*cancel` turns true (a controller shutting down).
  caf::actor connect(const node_address& node, const std::atomic<bool>* cancel = nullptr) const;

  // Spawns a stage of `type` ("tokenizer", "scheduler", "worker", "detokenizer") on the node, as
  // its `Handle` (stages/stage_interfaces.hpp): the node refuses the spawn when the stage
  // registered under `type` has another interface.
  template <class Handle>
  Handle spawn(const node_address& node, const std::string& type, caf::message spec,
               const std::atomic<bool>* cancel = nullptr) const;

  // The same on `node`, or in this process when `node` is null (the controller's own stages):
  // through the same factory either way (node/stage_factories.hpp), so a stage is built from its
  // spec wherever it runs.
  template <class Handle>
  Handle spawn_on(const node_address* node, const std::string& type, caf::message spec,
                  const std::atomic<bool>* cancel = nullptr) const;

  // Asks `stage` (on some node) and waits for one answer of type T, or for the stage to end
  // (its exit reason names what went wrong, e.g. a model that would not load); throws then.
  // ask waits at most request_timeout_ms; ask_within as long as `timeout` says (caf::infinite:
  // a stage of this process loading a model, which takes what it takes).
  template <class T, class Handle, class... Ts>
  T ask(const Handle& stage, const std::string& what, Ts&&... message) const {
    return ask_within<T>(stage, what, std::chrono::milliseconds(settings_.request_timeout_ms),
                         std::forward<Ts>(message)...);
  }
  template <class T, class Handle, class Timeout, class... Ts>
  T ask_within(const Handle& stage, const std::string& what, const Timeout& timeout, Ts&&... message) const;

 private:
  // Names this link's owner to `agent` as the owner of `stage` (node/stage_owner.hpp).
  void tell_owner(const caf::actor& agent, const caf::actor& stage) const;
  // "node NAME at HOST:PORT", for errors.
  static std::string where(const node_address& node);

  caf::actor_system& system_;
  const cluster_settings& settings_;
  caf::actor owner_;
};

// -- ask: waits for the answer or the stage's end, whichever comes first --------------------------

template <class Handle>
Handle node_link::spawn(const node_address& node, const std::string& type, caf::message spec,
                        const std::atomic<bool>* cancel) const {
  caf::actor agent = connect(node, cancel);
  auto stage = system_.middleman().remote_spawn<Handle>(agent->node(), type, std::move(spec),
                                                        std::chrono::milliseconds(settings_.request_timeout_ms));
  if (!stage)
    throw std::runtime_error("cannot spawn a " + type + " on " + where(node) + ": " + system_.render(stage.error()));
  // The node stops it if this process goes away (node/stage_owner.hpp).
  tell_owner(agent, caf::actor_cast<caf::actor>(*stage));
  return *stage;
}

template <class Handle>
Handle node_link::spawn_on(const node_address* node, const std::string& type, caf::message spec,
                           const std::atomic<bool>* cancel) const {
  if (node) return spawn<Handle>(*node, type, std::move(spec), cancel);
  auto stage = system_.spawn<Handle>(type, std::move(spec));
  if (!stage) throw std::runtime_error("cannot spawn a " + type + ": " + system_.render(stage.error()));
  return *stage;
}

template <class T, class Handle, class Timeout, class... Ts>
T node_link::ask_within(const Handle& stage, const std::string& what, const Timeout& timeout, Ts&&... message) const {
  caf::scoped_actor self(system_);
  self->monitor(stage);
  std::optional<T> answer;
  std::string failure;
  self->request(stage, timeout, std::forward<Ts>(message)...)
      .receive([&](T& value) { answer = std::move(value); },
               [&](caf::error& error) { failure = system_.render(error); });
  if (answer) return std::move(*answer);
  // A stage that failed while loading has ended with the reason: prefer it to "receiver down".
  self->receive([&](caf::down_msg& down) { failure = system_.render(down.reason); },
                caf::after(std::chrono::milliseconds(200)) >> [] {});
  throw std::runtime_error(what + ": " + failure);
}

}  // namespace troupe
