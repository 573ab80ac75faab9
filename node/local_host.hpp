#pragma once
// Whether a [[nodes]] entry's host is this machine, so that `troupe launch` starts it here.

#include <string>

namespace troupe {

// True for "localhost", a loopback address (127.0.0.0/8, ::1) and any address one of this
// machine's interfaces holds (getifaddrs). Other names are not resolved: a topology that means
// this machine by a DNS name gives its address instead, and a name is never guessed local.
bool is_local_host(const std::string& host);

}  // namespace troupe
