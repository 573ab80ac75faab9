#pragma once
// A node that a controller places stages on (`troupe node`): one CAF actor system with the
// middleman and the cluster's TLS plane (node/tls_middleman.hpp), every stage type registered by name
// (node/stage_factories.hpp), and a small agent actor published over mutual TLS. It loads nothing until a controller
// remote-spawns a stage from its spec; then the stage loads what it needs, on this node.
//
// Only members of the cluster's CA get in: the agent is published with the member's certificate
// and key and the CA as the only trust anchor, so a peer whose certificate the CA did not issue
// fails the TLS handshake. There is no plaintext mode.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <caf/atom.hpp>

#include "node/tls_limits.hpp"

namespace troupe {

// Ask a node's agent who it is: it answers (std::string name, std::vector<std::string> stages),
// the type names of the stages it runs, in the order they were spawned.
using ping_atom = caf::atom_constant<caf::atom("ping")>;

struct remote_node_options {
  std::string host;                       // the address to listen on, e.g. 127.0.0.1
  uint16_t port = 0;                      // 0: the system chooses (see remote_node::port)
  std::filesystem::path credentials_dir;  // from `troupe certs`: ca.crt, NAME.crt, NAME.key
  std::string name;                       // this member's name in the credentials, also the node's name in logs
  tls_limits tls;                         // the bounds of its cluster port (--handshake-timeout-ms, ...)
};

// "HOST:PORT" (PORT 0 to 65535) into options' host and port; throws std::invalid_argument naming
// the text and what is wrong.
void parse_listen_address(const std::string& text, remote_node_options& options);

class remote_node {
 public:
  // Checks the credentials first, then starts the actor system and publishes the agent; throws
  // std::runtime_error naming the file, address or setting that failed.
  explicit remote_node(const remote_node_options& options);
  ~remote_node();  // stops the stages and the agent
  remote_node(const remote_node&) = delete;
  remote_node& operator=(const remote_node&) = delete;

  uint16_t port() const;  // the port actually bound
  std::vector<std::string> running_stages() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Runs a node until SIGINT or SIGTERM; logs `node NAME listening on HOST:PORT` once it is up.
void run_node_until_signal(const remote_node_options& options);

}  // namespace troupe
