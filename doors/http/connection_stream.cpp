#include "doors/http/connection_stream.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "doors/http/socket_address.hpp"

namespace troupe {

namespace {

using namespace std::chrono_literals;

int poll_one(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  int n;
  do {
    n = ::poll(&p, 1, static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, timeout.count())));
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace

void close_connection(http_connection& connection) {
  if (connection.fd < 0) return;
  ::shutdown(connection.fd, SHUT_RDWR);
  ::close(connection.fd);
  connection.fd = -1;
}

bool send_final_error(int fd, int status, const std::string& reason, const std::string& json_body) {
  const std::string response =
      "HTTP/1.1 " + std::to_string(status) + " " + reason +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(json_body.size()) +
      "\r\nConnection: close\r\n\r\n" + json_body;
  const ssize_t n = ::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  return n == static_cast<ssize_t>(response.size());
}

connection_stream::connection_stream(http_connection connection, std::chrono::milliseconds write_timeout,
                                     const std::atomic<bool>& stopping, const std::string& timeout_body)
    : connection_(std::move(connection)),
      write_timeout_(write_timeout),
      stopping_(stopping),
      timeout_body_(timeout_body) {}

connection_stream::~connection_stream() { close_connection(connection_); }

http_connection connection_stream::release() {
  connection_.pending.erase(0, num_consumed_);
  num_consumed_ = 0;
  return std::exchange(connection_, http_connection{});
}

bool connection_stream::is_readable() const {
  return num_consumed_ < connection_.pending.size() || (!timed_out_ && poll_one(connection_.fd, POLLIN, 0ms) > 0);
}

bool connection_stream::is_writable() const {
  if (timed_out_ || poll_one(connection_.fd, POLLOUT, write_timeout_) <= 0) return false;
  // The peer has not closed: a peek finds bytes (a pipelined request) or none yet.
  char byte;
  const ssize_t n = ::recv(connection_.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

ssize_t connection_stream::read(char* ptr, size_t size) {
  auto& pending = connection_.pending;
  if (num_consumed_ == pending.size() && num_consumed_ > 0) {
    pending.clear();
    num_consumed_ = 0;
  }
  if (num_consumed_ == pending.size()) {
    if (timed_out_) return -1;
    // httplib reads headers a byte at a time: receive in blocks. Bytes already there are taken
    // whatever the time; only a wait for more is bounded by the deadline.
    char block[16384];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(connection_.deadline -
                                                                              std::chrono::steady_clock::now());
      const int ready = poll_one(connection_.fd, POLLIN, std::clamp(left + 1ms, 0ms, 200ms));
      if (ready < 0) return -1;
      if (ready > 0) {
        const ssize_t n = ::recv(connection_.fd, block, sizeof block, MSG_DONTWAIT);
        if (n > 0) {
          pending.assign(block, static_cast<size_t>(n));
          break;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return n;
      } else if (left <= 0ms) {
        timed_out_ = true;
        send_final_error(connection_.fd, 408, "Request Timeout", timeout_body_);
        return -1;
      }
      if (stopping_) return -1;
    }
  }
  const size_t n = std::min(size, pending.size() - num_consumed_);
  std::copy_n(pending.data() + num_consumed_, n, ptr);
  num_consumed_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t connection_stream::write(const char* ptr, size_t size) {
  if (timed_out_ || poll_one(connection_.fd, POLLOUT, write_timeout_) <= 0) return -1;
  return ::send(connection_.fd, ptr, size, MSG_NOSIGNAL);
}

void connection_stream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(connection_.fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    describe_address(address, ip, port);
}

void connection_stream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(connection_.fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    describe_address(address, ip, port);
}

}  // namespace troupe
