#pragma once
// The bounds of a process's TLS plane (node/tls_middleman.hpp), as the topology's [cluster] and
// `troupe node`'s flags set them.

#include <cstddef>

#include "net/connection_guard.hpp"

namespace troupe {

struct tls_limits {
  connection_limits connections;  // per listening port; handshake_timeout for outgoing ones too
  // The largest CAF message (its payload, as BASP's header announces it) read from a member:
  // 64 MiB holds a 1M-token prompt sixteen times over; bulk KV never rides CAF messages.
  size_t max_message_bytes = size_t(64) << 20;
};

}  // namespace troupe
