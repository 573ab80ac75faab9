#include "doors/http/request_reception.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "doors/http/api_error.hpp"

namespace troupe {

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// How long a connection sent a final error is read and dropped before it is closed.
constexpr auto linger_time = 1000ms;

std::string error_body(std::string message) {
  api_error e;
  e.message = std::move(message);
  return e.to_json();
}

// The Content-Length a header block declares (the first one; digits only, saturating), or 0.
uint64_t declared_content_length(std::string_view block) {
  constexpr std::string_view name = "content-length:";
  for (size_t line = block.find("\r\n"); line != std::string_view::npos; line = block.find("\r\n", line + 2)) {
    const std::string_view rest = block.substr(line + 2);
    if (rest.size() < name.size()) return 0;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i)
      same = std::tolower(static_cast<unsigned char>(rest[i])) == name[i];
    if (!same) continue;
    uint64_t value = 0;
    for (size_t i = name.size(); i < rest.size() && rest[i] != '\r'; ++i) {
      if (rest[i] == ' ' || rest[i] == '\t') continue;
      if (rest[i] < '0' || rest[i] > '9') return 0;  // httplib answers a malformed length itself
      value = value > (UINT64_MAX - 9) / 10 ? UINT64_MAX : value * 10 + uint64_t(rest[i] - '0');
    }
    return value;
  }
  return 0;
}

}  // namespace

size_t header_block_end(std::string_view bytes, size_t searched_from) {
  // The request line may itself end the block ("\r\n" at once is httplib's 400 to give).
  const size_t from = searched_from >= 2 ? searched_from - 2 : 0;
  const size_t at = bytes.find("\n\r\n", from);
  return at == std::string_view::npos ? at : at + 3;
}

request_reception::request_reception(reception_options options, ready_fn on_ready)
    : options_(options), on_ready_(std::move(on_ready)) {}

request_reception::~request_reception() { stop(); }

void request_reception::start() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    throw std::runtime_error(std::string("http: cannot create the request reception's epoll: ") + std::strerror(errno));
  }
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &e);
  thread_ = std::thread([this] { run(); });
}

void request_reception::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (thread_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  for (auto& w : incoming_) close_connection(w.connection);
  incoming_.clear();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

void request_reception::add_new(int fd) {
  waiting w;
  w.connection.fd = fd;
  w.connection.deadline = steady::now() + options_.request_timeout;
  w.state = phase::receiving;
  w.since = steady::now();
  hand_over(std::move(w));
}

void request_reception::add_kept(http_connection connection) {
  waiting w;
  w.state = connection.pending.empty() ? phase::idle : phase::receiving;
  // Pipelined bytes are the start of a request already arriving; else it may be a while.
  connection.deadline = steady::now() + (w.state == phase::idle ? options_.idle_timeout : options_.request_timeout);
  w.connection = std::move(connection);
  w.since = steady::now();
  hand_over(std::move(w));
}

void request_reception::add_closing(http_connection connection) {
  ::shutdown(connection.fd, SHUT_WR);
  waiting w;
  w.state = phase::closing;
  connection.pending.clear();
  connection.deadline = steady::now() + linger_time;
  w.connection = std::move(connection);
  w.since = steady::now();
  hand_over(std::move(w));
}

// To the reception's thread, which takes `incoming_` when woken; closed at once once stopped.
void request_reception::hand_over(waiting w) {
  std::lock_guard lock(mutex_);
  if (stopped_) return close_connection(w.connection);
  // httplib's accept thread can outrun this one (a flood on a loaded machine): the queue between
  // them counts against the same bound as the connections waiting in the reception, the one
  // queued longest closed, or every connection queued here held a descriptor until the reception
  // took it (the controller reached its open-files limit).
  while (!incoming_.empty() && incoming_.size() + num_waiting_.load() >= options_.max_connections) {
    close_connection(incoming_.front().connection);
    incoming_.erase(incoming_.begin());
  }
  incoming_.push_back(std::move(w));
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void request_reception::run() {
  std::array<epoll_event, 64> events;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) break;
    }
    auto now = steady::now();
    auto next = now + 1000ms;
    for (auto& [fd, w] : waiting_) next = std::min(next, w.connection.deadline);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now) + 1ms;
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                               static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, wait.count())));
    for (int i = 0; i < n; ++i) {
      if (events[static_cast<size_t>(i)].data.fd == wake_fd_) {
        uint64_t count;
        [[maybe_unused]] auto r = ::read(wake_fd_, &count, sizeof count);
        take_incoming();
      } else {
        on_readable(events[static_cast<size_t>(i)].data.fd);
      }
    }
    expire(steady::now());
    num_waiting_ = waiting_.size();
  }
  for (auto& [fd, w] : waiting_) close_connection(w.connection);
  waiting_.clear();
}

void request_reception::take_incoming() {
  std::vector<waiting> arrived;
  {
    std::lock_guard lock(mutex_);
    arrived.swap(incoming_);
  }
  for (auto& w : arrived) admit(std::move(w));
}

void request_reception::admit(waiting w) {
  // A kept connection whose pipelined bytes already hold its next request goes straight on.
  if (w.state == phase::receiving) {
    const size_t end = header_block_end(w.connection.pending);
    if (end != std::string_view::npos && end <= options_.max_header_bytes) {
      if (!refuse_oversized_body(w, end)) return on_ready_(std::move(w.connection));
      w.since = steady::now();
    } else if (w.connection.pending.size() > options_.max_header_bytes) {
      refuse(
          w, 431, "Request Header Fields Too Large",
          error_body("the request's line and headers exceed " + std::to_string(options_.max_header_bytes) + " bytes"));
      w.since = steady::now();
    }
    w.num_searched = w.connection.pending.size();
  }
  if (waiting_.size() >= options_.max_connections) {
    // The one waiting longest: a client that sends its request whole is never the one closed.
    auto oldest = std::min_element(waiting_.begin(), waiting_.end(),
                                   [](const auto& a, const auto& b) { return a.second.since < b.second.since; });
    drop(oldest->first);
  }
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP;
  e.data.fd = w.connection.fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w.connection.fd, &e) != 0) return close_connection(w.connection);
  const int fd = w.connection.fd;
  waiting_.emplace(fd, std::move(w));
  num_waiting_ = waiting_.size();
}

void request_reception::on_readable(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  waiting& w = it->second;
  std::array<char, 16384> block;
  if (w.state == phase::closing) {
    // Drops what a refused client still sends, until it closes or the linger time is up.
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(fd, block.data(), block.size(), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return drop(fd);
      if (n < 0) return;
    }
    return;
  }
  auto& pending = w.connection.pending;
  // Never more than one byte past the bound is kept.
  const size_t room = options_.max_header_bytes + 1 - std::min(pending.size(), options_.max_header_bytes);
  const ssize_t n = ::recv(fd, block.data(), std::min(block.size(), room), MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return drop(fd);
  if (n < 0) return;
  if (w.state == phase::idle) {
    w.state = phase::receiving;
    w.connection.deadline = steady::now() + options_.request_timeout;
  }
  pending.append(block.data(), static_cast<size_t>(n));
  const size_t end = header_block_end(pending, w.num_searched);
  w.num_searched = pending.size();
  if (end != std::string_view::npos && end <= options_.max_header_bytes) {
    if (refuse_oversized_body(w, end)) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    http_connection ready = std::move(w.connection);
    waiting_.erase(it);
    return on_ready_(std::move(ready));
  }
  if (pending.size() > options_.max_header_bytes) {
    refuse(w, 431, "Request Header Fields Too Large",
           error_body("the request's line and headers exceed " + std::to_string(options_.max_header_bytes) + " bytes"));
  }
}

void request_reception::expire(steady_time now) {
  std::vector<int> late;
  for (auto& [fd, w] : waiting_) {
    if (w.connection.deadline <= now) late.push_back(fd);
  }
  for (int fd : late) {
    waiting& w = waiting_.at(fd);
    if (w.state == phase::receiving && !w.connection.pending.empty()) {
      refuse(w, 408, "Request Timeout",
             error_body("the request's line and headers did not arrive within " +
                        std::to_string(options_.request_timeout.count()) + " ms"));
    } else {
      drop(fd);  // closing and lingered long enough, or never sent a byte
    }
  }
}

bool request_reception::refuse_oversized_body(waiting& w, size_t header_end) {
  // httplib would read and drop the whole announced body before it answered 413: a 64 MiB
  // Content-Length with no body held a thread until the 408, 10 s later (issue 25).
  if (options_.max_body_bytes == 0) return false;
  const uint64_t length = declared_content_length(std::string_view(w.connection.pending).substr(0, header_end));
  if (length <= options_.max_body_bytes) return false;
  refuse(w, 413, "Payload Too Large",
         error_body("the request body of " + std::to_string(length) + " bytes (its Content-Length) exceeds " +
                    std::to_string(options_.max_body_bytes) + " bytes"));
  return true;
}

void request_reception::refuse(waiting& w, int status, const std::string& reason, const std::string& body) {
  send_final_error(w.connection.fd, status, reason, body);
  ++num_refused_;
  ::shutdown(w.connection.fd, SHUT_WR);
  w.state = phase::closing;
  w.connection.pending.clear();
  w.connection.pending.shrink_to_fit();
  w.connection.deadline = steady::now() + linger_time;
}

void request_reception::drop(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close_connection(it->second.connection);
  waiting_.erase(it);
}

}  // namespace troupe
