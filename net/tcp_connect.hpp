#pragma once
// A TCP connection made within a deadline. connect(2) on a blocking socket waits for the
// kernel's SYN retries (about two minutes) when a host does not answer; a caller that must stay
// responsive (a controller reaching its nodes, an admin client) gets its answer within `timeout`.

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe {

// A connected, non-blocking, close-on-exec socket to host:port (names resolved, every address
// tried in turn within the one deadline), or -1 with `why` naming the address and the reason.
int connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, std::string& why);

}  // namespace troupe
