#pragma once
// A loopback port no one listens on now. Tests and benchmarks start servers and nodes as child
// processes on ports they must name in advance (a topology lists its nodes' addresses); binding
// port 0 and reading what the kernel chose gives one that is free at that moment. A race with
// another process taking it before the child binds is possible and rare: the kernel hands out
// ephemeral ports in turn, so a port just released is not handed out again soon.

#include <cstdint>

namespace troupe {

// Throws std::runtime_error when no socket can be bound on 127.0.0.1.
uint16_t free_loopback_port();

}  // namespace troupe
