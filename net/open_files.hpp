#pragma once
// The process's open-files limit: the one budget every listener shares. Services often start
// with a soft limit of 1024 under a much higher hard limit; a flood of idle connections on the
// client doors then took the descriptors the engine needed (issue 25). At start-up the soft
// limit is raised to the hard one, as vLLM does, and each door caps its connections to a share
// of what is left, so that no door alone can take the process's last descriptors.

#include <cstddef>

namespace troupe {

struct open_files_limit {
  size_t soft = 0;  // RLIMIT_NOFILE's current (soft) limit
  size_t hard = 0;  // the most it may be raised to without privileges
};

open_files_limit current_open_files_limit();

// Raises the soft limit to the hard one (capped at `ceiling`: an unlimited hard limit would make
// a per-door share meaningless); the limit before and after. Failures leave it as it was.
struct open_files_raise {
  open_files_limit before;
  open_files_limit after;
};
open_files_raise raise_open_files_limit(size_t ceiling = size_t{1} << 20);

// The most connections one client door keeps open at once: a sixth of the soft limit, so that a
// controller whose three listeners are flooded at once (the two client doors and its cluster
// port, whose pending handshakes are bounded apart) still keeps a quarter of its descriptors for
// the engine (the cluster's links, the KV plane, files); at least 16, at most `door_max`. (A
// quarter each left too little: under RLIMIT_NOFILE 256 a flooded controller peaked at 215-232.)
size_t door_connection_share(size_t soft_limit, size_t door_max);

}  // namespace troupe
