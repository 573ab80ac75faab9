#include "doors/http/socket_address.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace troupe {

bool describe_address(const sockaddr_storage& address, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    if (!inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text)) return false;
    port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (!inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text)) return false;
    port = ntohs(v6.sin6_port);
  } else {
    return false;
  }
  ip = text;
  return true;
}

}  // namespace troupe
