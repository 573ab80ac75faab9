#pragma once
// The address of a connected socket's peer, for logs and refusals.

#include <string>

namespace troupe {

// "HOST:PORT" of the socket's peer, or "a peer" when the socket has none (already reset).
std::string peer_address(int fd);

}  // namespace troupe
