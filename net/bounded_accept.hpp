#pragma once
// accept() that survives running out of file descriptors. When the process is at its open-files
// limit, accept fails with EMFILE and leaves the connection in the listen queue: a poll loop
// (level-triggered) then wakes at once, forever, at 100 % CPU, and every refused peer's retry
// makes it worse. Here one descriptor is held in reserve (/dev/null): on EMFILE it is given up
// for the moment it takes to accept the waiting connection and close it, so the queue drains and
// the listener goes quiet until the process has descriptors again.

#include <string>

namespace troupe {

// Opens the reserve descriptor if it is not open (idempotent, thread-safe). Listeners call it
// when they open, before any flood, so that the reserve exists when it is needed.
void reserve_spare_descriptor();

// One connection from the non-blocking `listener`, non-blocking and close-on-exec: its
// descriptor, or -1. -1 with `shed` empty: nothing is waiting (or a transient error such as a
// peer that reset before accept); -1 with `shed` set: a waiting connection was accepted and
// closed because the process has no descriptor for it (`shed` says so, for the refusal log).
int accept_connection(int listener, std::string& shed);

}  // namespace troupe
