#pragma once
// One end of a TCP socket as text and number (IPv4 or IPv6), for the HTTP door's pieces that
// need to name or match a connection.

#include <sys/socket.h>

#include <string>

namespace troupe {

// False for an address family other than IPv4 and IPv6 (then `ip` and `port` are untouched).
bool describe_address(const sockaddr_storage& address, std::string& ip, int& port);

}  // namespace troupe
