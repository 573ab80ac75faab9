#include "kvtransfer/kv_tcp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace troupe {

namespace {

std::string system_error() { return std::strerror(errno); }

int milliseconds_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1000));
}

bool wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

// "kvtcp://HOST:PORT" -> HOST, PORT; false when it is not that shape.
bool split_endpoint(const std::string& endpoint, std::string& host, std::string& port) {
  if (!is_kv_tcp_endpoint(endpoint)) return false;
  const std::string rest = endpoint.substr(kv_tcp_scheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return false;
  host = rest.substr(0, colon);
  port = rest.substr(colon + 1);
  return true;
}

}  // namespace

int kv_tcp_listen(const std::string& host, std::string& endpoint, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error("kv tcp: cannot resolve bind host " + host + ": " + gai_strerror(rc));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    if (port != 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restarted stage rebinds
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      why = system_error();
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) throw std::runtime_error("kv tcp: cannot bind " + host + ":" + service + ": " + why);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  char text[INET6_ADDRSTRLEN] = {};
  if (bound.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&bound);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
    endpoint = std::string(kv_tcp_scheme) + "[" + text + "]:" + std::to_string(port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&bound);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
    endpoint = std::string(kv_tcp_scheme) + text + ":" + std::to_string(port);
  }
  return fd;
}

static void set_timeout(int fd, int option, std::chrono::milliseconds wait) {
  timeval t{};
  t.tv_sec = static_cast<time_t>(wait.count() / 1000);
  t.tv_usec = static_cast<suseconds_t>(wait.count() % 1000 * 1000);
  ::setsockopt(fd, SOL_SOCKET, option, &t, sizeof t);
}

static void make_blocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

int kv_tcp_connect(const std::string& endpoint, std::chrono::milliseconds timeout, std::chrono::milliseconds send_wait,
                   std::string& why) {
  std::string host, port;
  if (!split_endpoint(endpoint, host, port)) {
    why = "endpoint " + endpoint + " is not kvtcp://HOST:PORT";
    return -1;
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    why = "cannot resolve " + endpoint + ": " + gai_strerror(rc);
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int fd = -1;
  why = "no address for " + endpoint;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS && wait_for(fd, POLLOUT, milliseconds_until(deadline))) {
      int error = 0;
      socklen_t length = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      errno = error;
      rc = error == 0 ? 0 : -1;
    } else if (rc != 0 && errno == EINPROGRESS) {
      errno = ETIMEDOUT;
    }
    if (rc != 0) {
      why = "cannot connect to " + endpoint + ": " + system_error();
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // a frame's tail goes out at once
    // Blocking writes wait for room inside the kernel, as the plain copy's do; SO_SNDTIMEO bounds
    // each wait so the sender thread still sees deadlines and cancels.
    make_blocking(fd);
    set_timeout(fd, SO_SNDTIMEO, send_wait);
  }
  return fd;
}

void kv_tcp_prepare_accepted(int fd, std::chrono::milliseconds stall_timeout) {
  make_blocking(fd);
  set_timeout(fd, SO_RCVTIMEO, stall_timeout);
}

kv_tcp_write kv_tcp_write_frame(int fd, std::span<const std::byte> header, std::span<const std::byte> payload,
                                std::chrono::steady_clock::time_point deadline, std::string& why) {
  const size_t total = header.size() + payload.size();
  size_t written = 0;
  while (written < total) {
    iovec parts[2];
    int count = 0;
    if (written < header.size()) {
      parts[count++] = {const_cast<std::byte*>(header.data()) + written, header.size() - written};
      if (!payload.empty()) parts[count++] = {const_cast<std::byte*>(payload.data()), payload.size()};
    } else {
      const size_t at = written - header.size();
      parts[count++] = {const_cast<std::byte*>(payload.data()) + at, payload.size() - at};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // the send wait passed with no room
      if (written == 0) return kv_tcp_write::no_room;
      if (std::chrono::steady_clock::now() >= deadline) {
        why = "the receiver took " + std::to_string(written) + " of the frame's " + std::to_string(total) +
              " bytes before the transfer's deadline";
        return kv_tcp_write::failed;
      }
      continue;
    }
    why = "writing a frame: " + (n == 0 ? std::string("the connection closed") : system_error());
    return kv_tcp_write::failed;
  }
  return kv_tcp_write::done;
}

bool kv_tcp_peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool kv_tcp_read_exact(int fd, std::span<std::byte> out, std::chrono::steady_clock::time_point deadline,
                       std::string& why) {
  size_t read = 0;
  while (read < out.size()) {
    if (read > 0 && std::chrono::steady_clock::now() > deadline) {
      why = "the peer sent " + std::to_string(read) + " of " + std::to_string(out.size()) +
            " bytes by the read's deadline (too slow, or dripping)";
      return false;
    }
    // Blocking, all at once: the kernel wakes this thread when the bytes are there, not per packet.
    const ssize_t n = ::recv(fd, out.data() + read, out.size() - read, MSG_WAITALL);
    if (n > 0) {
      read += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      why = read == 0 ? "the peer closed the connection" : "the peer closed the connection inside a frame";
      return false;
    }
    if (errno == EINTR) continue;
    why = errno == EAGAIN || errno == EWOULDBLOCK ? "the peer stalled inside a frame"
                                                  : "reading a frame: " + system_error();
    return false;
  }
  return true;
}

}  // namespace troupe
