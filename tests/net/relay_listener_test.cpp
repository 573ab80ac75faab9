// The bounded listener in front of the ZeroMQ door: it relays bytes both ways unchanged, holds one
// descriptor for a client that has not spoken, closes a silent client at its deadline, refuses
// beyond its connection cap, and under a flood of idle connections holds no more descriptors
// than its pending slots.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "net/relay_listener.hpp"
#include "tests/loopback_socket.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

// A Unix socket server that echoes every byte back, one thread per connection.
class unix_echo_server {
 public:
  unix_echo_server() {
    path_ = (std::filesystem::temp_directory_path() /
             ("troupe-relay-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_id()) + ".sock"))
                .string();
    std::filesystem::remove(path_);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd_, 1024) != 0) {
      throw std::runtime_error("echo server: cannot listen on " + path_);
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~unix_echo_server() {
    stopping_ = true;
    thread_.join();
    for (int fd : accepted_) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : echoes_) t.join();
    for (int fd : accepted_) ::close(fd);
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  const std::string& path() const { return path_; }
  int num_accepted() const { return num_accepted_; }

 private:
  static int next_id() {
    static std::atomic<int> id{0};
    return id++;
  }
  void serve() {
    while (!stopping_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      accepted_.push_back(fd);
      ++num_accepted_;
      echoes_.emplace_back([fd] {
        char buffer[4096];
        for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) {
          for (ssize_t done = 0; done < n;) {
            const ssize_t w = ::write(fd, buffer + done, static_cast<size_t>(n - done));
            if (w <= 0) return;
            done += w;
          }
        }
      });
    }
  }

  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> num_accepted_{0};
  std::vector<int> accepted_;
  std::vector<std::thread> echoes_;
  std::thread thread_;
};

// A client connection whose reads give up after 5 s.
int connect_to(uint16_t port) {
  const int fd = testing::connect_loopback(port);
  if (fd < 0) return -1;
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  return fd;
}

// True when the server has closed `fd` (end of stream or reset) within `within`.
bool closed_by_server(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

relay_listener_options options_for(const unix_echo_server& server) {
  relay_listener_options o;
  o.target_path = server.path();
  o.greeting_bytes = 8;
  o.where = "test relay";
  return o;
}

TEST(relay_listener, relays_bytes_both_ways_unchanged_past_its_buffers) {
  unix_echo_server server;
  relay_listener relay(options_for(server));
  relay.start();
  const int fd = connect_to(relay.port());
  ASSERT_GE(fd, 0);
  // 1 MiB, 32 times a relay buffer: the relay's back-pressure is crossed many times.
  std::string sent(1 << 20, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  std::thread writer([&] {
    for (size_t done = 0; done < sent.size();) {
      const ssize_t n = ::send(fd, sent.data() + done, sent.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  });
  std::string received;
  char buffer[65536];
  while (received.size() < sent.size()) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
  }
  writer.join();
  EXPECT_EQ(received.size(), sent.size());
  EXPECT_TRUE(received == sent);
  EXPECT_EQ(relay.num_relayed(), 1u);
  EXPECT_EQ(relay.counts().num_established, 1u);
  ::close(fd);
  // The client gone, the relay closes the server's side too.
  for (int i = 0; i < 100 && relay.num_relayed() != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(relay.num_relayed(), 0u);
}

TEST(relay_listener, a_silent_client_reaches_no_server_and_is_closed_at_its_deadline) {
  unix_echo_server server;
  auto o = options_for(server);
  o.limits.handshake_timeout = 300ms;
  relay_listener relay(o);
  relay.start();
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(connect_to(relay.port()));
  // A client that sends less than its greeting is relayed but still pending.
  const int slow = connect_to(relay.port());
  ASSERT_EQ(::send(slow, "abc", 3, MSG_NOSIGNAL), 3);
  char echo[3];
  ASSERT_EQ(::recv(slow, echo, 3, MSG_WAITALL), 3);
  EXPECT_EQ(server.num_accepted(), 1);
  EXPECT_EQ(relay.counts().num_pending, 11u);
  for (int fd : silent) EXPECT_TRUE(closed_by_server(fd, 2s));
  EXPECT_TRUE(closed_by_server(slow, 2s));
  EXPECT_EQ(relay.counts().num_timed_out, 11u);
  for (int fd : silent) ::close(fd);
  ::close(slow);
}

TEST(relay_listener, refuses_beyond_its_connection_cap_and_makes_room_in_its_pending_slots) {
  unix_echo_server server;
  auto o = options_for(server);
  o.limits.max_connections = 4;
  o.limits.max_pending = 2;
  relay_listener relay(o);
  relay.start();
  std::vector<int> talking;
  for (int i = 0; i < 3; ++i) {
    talking.push_back(connect_to(relay.port()));
    ASSERT_EQ(::send(talking.back(), "greeting", 8, MSG_NOSIGNAL), 8);
    char echo[8];
    ASSERT_EQ(::recv(talking.back(), echo, 8, MSG_WAITALL), 8);
  }
  // One slot left: a silent client takes it; the next is beyond the cap and closed at once.
  const int silent = connect_to(relay.port());
  std::this_thread::sleep_for(50ms);
  const int beyond = connect_to(relay.port());
  EXPECT_TRUE(closed_by_server(beyond, 2s));
  EXPECT_FALSE(closed_by_server(silent, 100ms));
  EXPECT_EQ(relay.counts().num_refused, 1u);
  // The established ones still relay.
  ASSERT_EQ(::send(talking[0], "again", 5, MSG_NOSIGNAL), 5);
  char echo[5];
  EXPECT_EQ(::recv(talking[0], echo, 5, MSG_WAITALL), 5);
  for (int fd : talking) ::close(fd);
  ::close(silent);
  ::close(beyond);
}

TEST(relay_listener, a_flood_of_idle_connections_holds_no_more_descriptors_than_the_pending_slots) {
  unix_echo_server server;
  auto o = options_for(server);
  o.limits.max_pending = 16;
  o.limits.max_connections = 64;
  relay_listener relay(o);
  relay.start();
  const size_t before = testing::open_descriptors();
  // Sampled while the flood arrives, not only after: connections shut to make room must be
  // closed at once, not at their next event (a batch of accepts held a batch of them).
  std::vector<int> flood;
  flood.reserve(300);
  std::atomic<size_t> num_flood{0};
  std::atomic<bool> flooding{true};
  std::atomic<size_t> peak{0};
  std::thread sampler([&] {
    while (flooding) {
      const size_t open = testing::open_descriptors();
      const size_t clients = num_flood.load();  // read after: never counts a client's own as the relay's
      // The descriptor being opened for the next client, and the directory listing's own.
      const size_t held = open > before + clients + 2 ? open - before - clients - 2 : 0;
      peak = std::max(peak.load(), held);
    }
  });
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_to(relay.port());
    if (fd >= 0) flood.push_back(fd);
    num_flood = flood.size();
  }
  std::this_thread::sleep_for(300ms);  // the relay has accepted what it will
  flooding = false;
  sampler.join();
  EXPECT_LE(peak.load(), 16u + 4u) << "the relay held up to " << peak.load() << " descriptors for 300 idle clients";
  const size_t held_by_relay = testing::open_descriptors() - before - flood.size();
  EXPECT_LE(held_by_relay, 16u + 2u) << "the relay holds " << held_by_relay << " descriptors for 300 idle clients";
  EXPECT_EQ(server.num_accepted(), 0);
  // A real client still gets through: it evicts the oldest silent one.
  const int fd = connect_to(relay.port());
  ASSERT_EQ(::send(fd, "greeting", 8, MSG_NOSIGNAL), 8);
  char echo[8];
  EXPECT_EQ(::recv(fd, echo, 8, MSG_WAITALL), 8);
  ::close(fd);
  for (int f : flood) ::close(f);
}

TEST(relay_listener, names_an_address_it_cannot_listen_on) {
  unix_echo_server server;
  relay_listener first(options_for(server));
  first.start();
  auto o = options_for(server);
  o.port = first.port();
  relay_listener second(o);
  try {
    second.start();
    FAIL() << "bound a port already taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
