#pragma once
// One connection of the cluster's TLS plane as CAF's middleman sees it: a scribe (CAF's stream
// over a socket) whose bytes go through an OpenSSL session, with the bounds CAF 0.17 lacks.
//
// - Its handshake has a deadline: the connection is pending in its listener's connection_guard
//   until the TLS handshake is done and the peer's first bytes of CAF's protocol have arrived;
//   the guard shuts it down when the deadline passes (a stranger that opens a connection and
//   says nothing held it forever: 0 of 400 closed in 15 s, issue 25).
// - Every size read from the socket is bounded here, the one place all of them pass: CAF's
//   protocol (BASP) reads a 32-byte header and then asks its scribe for exactly the payload size
//   the header announced, which CAF allocates at once. A member that announced 1 GiB made the
//   node allocate and keep 1 GB. A payload larger than `max_message_bytes` is never asked of the
//   stream: the connection is refused (logged, rate-limited) and closed.
// - OpenSSL's per-thread error queue is emptied before every call (CAF 0.17 never did: an error
//   a vanished peer left made the next harmless read on another connection look fatal).
// - A refused handshake (a certificate the CA did not issue) is logged once per connection,
//   through the listener's rate-limited refusal log, as `TLS handshake with HOST:PORT refused:
//   REASON`.

#include <cstddef>
#include <memory>
#include <string>

#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/scribe.hpp>

#include "net/connection_guard.hpp"
#include "net/peer_address.hpp"
#include "node/tls_context.hpp"

namespace troupe {

// The bounds a connection carries from its listener (or, connecting, from the middleman).
struct tls_connection_bounds {
  std::shared_ptr<connection_guard> guard;  // its handshake deadline and the listener's counts
  uint64_t ticket = 0;                      // its entry in the guard
  size_t max_message_bytes = 0;             // the largest CAF message payload read from it
};

// A scribe over `fd` (connected, non-blocking) with a TLS session from `context`; nullptr (the
// guard told, `fd` left open for the caller to close) when OpenSSL cannot make a session.
caf::io::scribe_ptr make_tls_scribe(caf::io::network::default_multiplexer& mpx, int fd, const tls_context& context,
                                    bool accepting, tls_connection_bounds bounds);

}  // namespace troupe
