#pragma once
// The cluster's TLS plane: how a node, a controller and an admin client publish actors and reach
// each other over mutual TLS, with the bounds CAF's OpenSSL module does not have.
//
// CAF 0.17 lets a program replace the actor that opens listening sockets and makes connections
// for the middleman (`io::middleman_actor_impl`, whose `open` and `connect` return CAF's own
// doormen and scribes); everything above (BASP, proxies, remote spawning, heartbeats) is CAF's,
// unchanged. This one hands out bounded doormen (node/tls_doorman.hpp) and TLS scribes
// (node/tls_connection.hpp) sharing one TLS context, and a thread expires handshakes past their
// deadline. It replaces caf::openssl::publish / remote_actor / the OpenSSL manager's actor.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman_actor.hpp>

#include "net/connection_guard.hpp"
#include "node/cluster_credentials.hpp"
#include "node/tls_limits.hpp"

namespace troupe {

struct tls_plane_state;

// Owns the TLS middleman actor of one actor system (the middleman module must be loaded) and
// registers it by name in the system's registry. Destroy it before the actor system: it stops
// the actor and the deadline thread, and waits for both.
class tls_middleman {
 public:
  // Throws std::runtime_error naming a credential file that cannot be used.
  tls_middleman(caf::actor_system& system, const member_credentials& files, tls_limits limits);
  ~tls_middleman();
  tls_middleman(const tls_middleman&) = delete;
  tls_middleman& operator=(const tls_middleman&) = delete;

  const caf::io::middleman_actor& actor() const { return actor_; }
  // Counts of every listener this process opened, summed (tests, the abuse suite's checks).
  connection_counts counts() const;

 private:
  caf::actor_system& system_;
  std::shared_ptr<tls_plane_state> state_;
  caf::io::middleman_actor actor_;
};

// The TLS middleman actor of `system` (null when none was made).
caf::io::middleman_actor tls_middleman_of(caf::actor_system& system);

// Publishes `whom` on host:port (port 0: any) over mutual TLS; the port bound. Waits at most
// `timeout` for the middleman.
caf::expected<uint16_t> tls_publish(caf::actor_system& system, const caf::actor& whom, uint16_t port,
                                    const std::string& host,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The actor published at host:port, reached over mutual TLS within `timeout` (connect, TLS
// handshake, CAF's handshake). Errors: sec::no_actor_published_at_port, or the connection's
// failure (sec::disconnect_during_handshake for a refused TLS handshake or a silent peer).
caf::expected<caf::actor> tls_remote_actor(caf::actor_system& system, const std::string& host, uint16_t port,
                                           std::chrono::milliseconds timeout);

}  // namespace troupe
