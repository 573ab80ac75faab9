#include "net/free_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>

namespace troupe {
namespace {

// The port handed out must be one a server can bind right after: that is its whole promise.
TEST(free_loopback_port, names_a_port_a_listener_can_bind) {
  const uint16_t port = free_loopback_port();
  ASSERT_NE(port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << "port " << port;
  EXPECT_EQ(::listen(fd, 1), 0);
  // While it is held, the next answer is another port.
  EXPECT_NE(free_loopback_port(), port);
  ::close(fd);
}

// Ports of the ephemeral range are every outgoing connection's local port; one picked there
// could be taken by a client's socket before the server binds it.
TEST(free_loopback_port, picks_below_the_ephemeral_range) {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  if (low - 10000 < 1000) GTEST_SKIP() << "the ephemeral range starts at " << low;
  for (int i = 0; i < 20; ++i) {
    const uint16_t port = free_loopback_port();
    EXPECT_GE(port, 10000);
    EXPECT_LT(port, low);
  }
}

}  // namespace
}  // namespace troupe
