#include "net/free_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <stdexcept>

namespace troupe {
namespace {

// Binds 127.0.0.1:port (0: any) and returns the port bound, or 0 when it cannot.
uint16_t try_bind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  socklen_t size = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0;
  ::close(fd);
  return ok ? ntohs(address.sin_port) : 0;
}

// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
int ephemeral_low() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 1024 && low <= 65535) return low;
  return 32768;
}

}  // namespace

uint16_t free_loopback_port() {
  // Ports from 10000 up to the range: away from the well-known and registered ones servers use.
  constexpr int lowest = 10000;
  const int below = ephemeral_low();
  if (below - lowest >= 1000) {
    thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<int> pick(lowest, below - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (const uint16_t port = try_bind(static_cast<uint16_t>(pick(rng)))) return port;
    }
  }
  // A range configured down to the well-known ports, or every try taken: any port the kernel gives.
  if (const uint16_t port = try_bind(0)) return port;
  throw std::runtime_error("free_loopback_port: cannot bind 127.0.0.1:0");
}

}  // namespace troupe
