#pragma once
// A loopback port no one listens on now. Tests and benchmarks start servers and nodes as child
// processes on ports they must name in advance (a topology lists its nodes' addresses), so the
// port is picked here and bound by the child moments later. It is picked below the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), at random, and checked by binding it:
// ephemeral ports are what every outgoing connection takes as its local port, so one picked from
// that range could be taken by some client's socket before the child binds it (a test that opens
// hundreds of connections lost its controller's port that way). Below the range only another
// explicit pick can take it, and a random one among thousands rarely does.

#include <cstdint>

namespace troupe {

// Throws std::runtime_error when no socket can be bound on 127.0.0.1.
uint16_t free_loopback_port();

}  // namespace troupe
