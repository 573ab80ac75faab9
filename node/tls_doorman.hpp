#pragma once
// A listening socket of the cluster's TLS plane as CAF's middleman sees it (a doorman), bounded:
// it accepts through net/bounded_accept (a process at its open-files limit sheds the connection
// instead of spinning), admits each connection into its connection_guard (at most max_pending
// in their handshake, the oldest closed to make room; at most max_connections open), and hands
// it to CAF as a TLS scribe (node/tls_connection.hpp).

#include <memory>

#include <caf/io/doorman.hpp>
#include <caf/io/network/default_multiplexer.hpp>

#include "net/connection_guard.hpp"
#include "node/tls_context.hpp"

namespace troupe {

struct tls_listener_settings {
  std::shared_ptr<const tls_context> context;
  std::shared_ptr<connection_guard> guard;
  size_t max_message_bytes = 0;
};

// A doorman over the listening socket `fd` (bound and listening).
caf::io::doorman_ptr make_tls_doorman(caf::io::network::default_multiplexer& mpx, int fd,
                                      tls_listener_settings settings);

}  // namespace troupe
