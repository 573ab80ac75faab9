#include "net/tcp_connect.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace troupe {

int connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, std::string& why) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    why = "cannot resolve " + host + ": " + gai_strerror(rc);
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int fd = -1;
  why = "no address for " + where;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = "cannot open a socket for " + where + ": " + std::strerror(errno);
      continue;
    }
    int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLOUT, 0};
      int rc;
      do {
        rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      } while (rc < 0 && errno == EINTR);
      if (rc <= 0) {
        error = ETIMEDOUT;
      } else {
        socklen_t length = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    if (error != 0) {
      why = error == ETIMEDOUT ? "cannot connect to " + where + " within " + std::to_string(timeout.count()) + " ms"
                               : "cannot connect to " + where + ": " + std::strerror(error);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

}  // namespace troupe
