#include "net/relay_listener.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "net/bounded_accept.hpp"
#include "net/peer_address.hpp"

namespace troupe {

namespace {

constexpr size_t k_buffer_bytes = 32 * 1024;
// epoll tags that are not a connection's (a connection's tag is ticket << 1 | side; tickets
// start at 1 and stay far below these).
constexpr uint64_t k_listener_tag = ~uint64_t{0};
constexpr uint64_t k_wake_tag = ~uint64_t{0} - 1;

// Bytes on their way in one direction: [begin, end) of a fixed buffer, made on first use.
struct byte_queue {
  std::unique_ptr<char[]> data;  // [k_buffer_bytes]
  size_t begin = 0;
  size_t end = 0;

  bool empty() const { return begin == end; }
  bool full() const { return end == k_buffer_bytes && begin == 0; }
  // Room at the tail, moving what is queued to the front when that makes some.
  size_t room() {
    if (!data) data = std::make_unique<char[]>(k_buffer_bytes);
    if (begin == end) begin = end = 0;
    if (end == k_buffer_bytes && begin > 0) {
      std::memmove(data.get(), data.get() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
    return k_buffer_bytes - end;
  }
};

enum class io_result { progress, would_block, closed };

// Reads what `fd` has into `q`, up to its room.
io_result fill(int fd, byte_queue& q, size_t& num_read) {
  num_read = 0;
  while (size_t room = q.room()) {
    const ssize_t n = ::recv(fd, q.data.get() + q.end, room, 0);
    if (n > 0) {
      q.end += static_cast<size_t>(n);
      num_read += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return io_result::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return io_result::would_block;
    return io_result::closed;
  }
  return io_result::progress;  // full: reading resumes when the other side has taken some
}

// Writes what `q` holds to `fd`, as much as it takes now.
io_result drain(int fd, byte_queue& q) {
  while (!q.empty()) {
    const ssize_t n = ::send(fd, q.data.get() + q.begin, q.end - q.begin, MSG_NOSIGNAL);
    if (n > 0) {
      q.begin += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return io_result::would_block;
    return io_result::closed;
  }
  return io_result::progress;
}

std::string format_address(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(address);
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
}

// A listening, non-blocking socket on host:port (the first address of `host` that binds).
int listen_on(const relay_listener_options& o) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = o.host == "*" ? AF_INET : AF_UNSPEC;  // libzmq's "*": every IPv4 interface
  std::string host = o.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(o.port);
  const int rc = ::getaddrinfo(o.host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    throw std::runtime_error(o.where + ": cannot resolve '" + o.host + "': " + ::gai_strerror(rc));
  }
  std::string failure = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      failure = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, o.backlog) != 0) {
      failure = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    throw std::runtime_error(o.where + ": cannot listen on " + o.host + ":" + port + ": " + failure);
  }
  return fd;
}

// A non-blocking connection to the Unix socket at `path`, or -1 (errno set).
int connect_unix(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // A Unix stream connect completes at once or fails (EAGAIN: the server's backlog is full).
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

}  // namespace

struct relay_listener::state {
  struct connection {
    uint64_t ticket = 0;
    int client_fd = -1;
    int server_fd = -1;           // -1 until the client has said something
    size_t num_client_bytes = 0;  // up to greeting_bytes: then it counts as established
    byte_queue up;                // client -> server
    byte_queue down;              // server -> client
    uint32_t client_events = 0;   // what epoll watches now on each side
    uint32_t server_events = 0;
  };

  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::atomic<size_t> num_relayed{0};
  std::unordered_map<uint64_t, std::unique_ptr<connection>> connections;

  ~state() {
    for (auto& [ticket, c] : connections) {
      if (c->client_fd >= 0) ::close(c->client_fd);
      if (c->server_fd >= 0) ::close(c->server_fd);
    }
    for (int fd : {listen_fd, epoll_fd, wake_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

relay_listener::relay_listener(relay_listener_options options)
    : options_(std::move(options)), state_(std::make_unique<state>()) {}

relay_listener::~relay_listener() { stop(); }

size_t relay_listener::num_relayed() const { return state_->num_relayed.load(); }

void relay_listener::start() {
  auto& s = *state_;
  reserve_spare_descriptor();
  s.listen_fd = listen_on(options_);
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&address), &length);
  bound_address_ = format_address(address);
  port_ = static_cast<uint16_t>(std::stoi(bound_address_.substr(bound_address_.rfind(':') + 1)));
  guard_ = std::make_shared<connection_guard>(options_.limits, options_.where + " " + bound_address_);
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.epoll_fd < 0 || s.wake_fd < 0) {
    throw std::runtime_error(options_.where + ": cannot make its event loop: " + std::strerror(errno));
  }
  epoll_event listen_event{EPOLLIN, {.u64 = k_listener_tag}};
  epoll_event wake_event{EPOLLIN, {.u64 = k_wake_tag}};
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &listen_event);
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &wake_event);
  thread_ = std::thread([this] { loop(); });
}

void relay_listener::stop() {
  if (!thread_.joinable()) return;
  state_->stopping = true;
  const uint64_t one = 1;
  (void)::write(state_->wake_fd, &one, sizeof one);
  thread_.join();
  auto& s = *state_;
  for (auto& [ticket, c] : s.connections) {
    guard_->closed(ticket);
    ::close(c->client_fd);
    if (c->server_fd >= 0) ::close(c->server_fd);
  }
  s.connections.clear();
  s.num_relayed = 0;
  ::close(s.listen_fd);
  s.listen_fd = -1;
}

void relay_listener::loop() {
  auto& s = *state_;
  using connection = state::connection;

  auto close_connection = [&](connection& c) {
    guard_->closed(c.ticket);  // before close(2): the guard never shuts a reused descriptor
    ::close(c.client_fd);
    if (c.server_fd >= 0) {
      ::close(c.server_fd);
      --s.num_relayed;
    }
    const uint64_t ticket = c.ticket;  // a copy: erasing destroys `c`
    s.connections.erase(ticket);
  };

  // Watches on each side what its queues allow: read while there is room for what is read,
  // write while there is something to write.
  auto watch = [&](connection& c) {
    const uint32_t client = (c.up.full() ? 0u : uint32_t(EPOLLIN)) | (c.down.empty() ? 0u : uint32_t(EPOLLOUT));
    if (client != c.client_events) {
      epoll_event e{client, {.u64 = c.ticket << 1}};
      ::epoll_ctl(s.epoll_fd, EPOLL_CTL_MOD, c.client_fd, &e);
      c.client_events = client;
    }
    if (c.server_fd < 0) return;
    const uint32_t server = (c.down.full() ? 0u : uint32_t(EPOLLIN)) | (c.up.empty() ? 0u : uint32_t(EPOLLOUT));
    if (server != c.server_events) {
      epoll_event e{server, {.u64 = c.ticket << 1 | 1}};
      ::epoll_ctl(s.epoll_fd, EPOLL_CTL_MOD, c.server_fd, &e);
      c.server_events = server;
    }
  };

  // The client has spoken: open its server side. False when the server cannot take it.
  auto open_server_side = [&](connection& c) {
    c.server_fd = connect_unix(options_.target_path);
    if (c.server_fd < 0) {
      guard_->log().refuse("the server behind the relay refused it",
                           "a connection not relayed: " + options_.target_path + ": " + std::strerror(errno));
      return false;
    }
    ++s.num_relayed;
    c.server_events = EPOLLIN;
    epoll_event e{EPOLLIN, {.u64 = c.ticket << 1 | 1}};
    ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, c.server_fd, &e);
    return true;
  };

  // Moves what each side has for the other; false when the connection is over (either side
  // closed or failed: the other is closed with it, what was still queued is dropped).
  auto pump = [&](connection& c, bool client_ready, bool server_ready) {
    if (client_ready) {
      size_t n = 0;
      const io_result r = fill(c.client_fd, c.up, n);
      if (n > 0 && c.num_client_bytes < options_.greeting_bytes) {
        c.num_client_bytes += n;
        if (c.num_client_bytes >= options_.greeting_bytes) guard_->established(c.ticket);
      }
      if (r == io_result::closed) return false;
      if (n > 0 && c.server_fd < 0 && !open_server_side(c)) return false;
    }
    if (c.server_fd >= 0) {
      if (server_ready) {
        size_t n = 0;
        if (fill(c.server_fd, c.down, n) == io_result::closed) return false;
      }
      if (drain(c.server_fd, c.up) == io_result::closed) return false;
    }
    return drain(c.client_fd, c.down) != io_result::closed;
  };

  auto accept_waiting = [&] {
    for (int n = 0; n < 256; ++n) {  // a bounded batch: the relayed connections are not starved
      std::string shed;
      const int fd = accept_connection(s.listen_fd, shed);
      if (!shed.empty()) guard_->log().refuse("out of file descriptors", shed);
      if (fd < 0) return;
      uint64_t evicted = 0;
      const uint64_t ticket = guard_->admit(fd, peer_address(fd), &evicted);
      if (auto it = s.connections.find(evicted); it != s.connections.end()) close_connection(*it->second);
      if (ticket == 0) {
        ::close(fd);
        continue;
      }
      // Each relayed write goes out at once, as libzmq's own TCP sockets do: with Nagle's
      // algorithm a small reply waited for the previous one's delayed ACK (a request's latency
      // through the door doubled).
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<connection>();
      c->ticket = ticket;
      c->client_fd = fd;
      c->client_events = EPOLLIN;
      epoll_event e{EPOLLIN, {.u64 = ticket << 1}};
      ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, fd, &e);
      s.connections.emplace(ticket, std::move(c));
    }
  };

  constexpr int k_max_events = 256;
  epoll_event events[k_max_events];
  auto last_expiry = std::chrono::steady_clock::now();
  while (!s.stopping) {
    const int n = ::epoll_wait(s.epoll_fd, events, k_max_events, 100);
    for (int i = 0; i < n && !s.stopping; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == k_wake_tag) continue;
      if (tag == k_listener_tag) {
        accept_waiting();
        continue;
      }
      auto it = s.connections.find(tag >> 1);
      if (it == s.connections.end()) continue;  // closed earlier in this batch
      connection& c = *it->second;
      const bool server_side = (tag & 1) != 0;
      const uint32_t what = events[i].events;
      const bool hung_up = (what & (EPOLLHUP | EPOLLERR)) != 0;
      const bool ready = hung_up || (what & EPOLLIN) != 0;
      // A side hung up (or shut down by the guard) ends the connection once what it had is moved.
      if (!pump(c, ready && !server_side, ready && server_side) || hung_up) {
        close_connection(c);
        continue;
      }
      watch(c);
    }
    // Handshake deadlines: the guard shuts the late ones down; their next event closes them.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_expiry >= std::chrono::milliseconds(100)) {
      guard_->expire(now);
      last_expiry = now;
    }
  }
}

}  // namespace troupe
