#include "node/node_link.hpp"

#include <chrono>
#include <stdexcept>
#include <thread>

#include <caf/io/middleman.hpp>
#include <caf/sec.hpp>
#include <caf/send.hpp>

#include "node/stage_owner.hpp"
#include "node/tls_middleman.hpp"

namespace troupe {

std::string node_link::where(const node_address& node) {
  return "node " + node.name + " at " + node.host + ":" + std::to_string(node.port);
}

caf::actor node_link::connect(const node_address& node, const std::atomic<bool>* cancel) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(settings_.connect_timeout_ms);
  std::string last_error;
  // Bounded by the deadline; a refused connection costs nothing, so retrying every 100 ms waits
  // out a node that is still starting (troupe launch starts them just before the controller).
  for (int attempt = 0; attempt < 100000; ++attempt) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto agent = tls_remote_actor(system_, node.host, node.port, std::max(left, std::chrono::milliseconds(100)));
    if (agent) return *agent;
    last_error = system_.render(agent.error());
    // A refused TLS handshake (a certificate of another CA) will not heal by waiting.
    if (agent.error() == caf::sec::disconnect_during_handshake) {
      throw std::runtime_error("cannot reach " + where(node) +
                               ": the TLS handshake failed (does its certificate come "
                               "from the cluster's CA, and ours from its?): " +
                               last_error);
    }
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) break;
    if (cancel && cancel->load()) throw std::runtime_error("connecting to " + where(node) + ": cancelled");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("cannot reach " + where(node) + " within " + std::to_string(settings_.connect_timeout_ms) +
                           " ms (is `troupe node` running there with credentials of the same CA?): " + last_error);
}

void node_link::tell_owner(const caf::actor& agent, const caf::actor& stage) const {
  if (owner_) caf::anon_send(agent, stage_owner_atom::value, stage, owner_);
}

}  // namespace troupe
