// A burst of clients connecting at once is served, not left waiting for SYN retries: the ZeroMQ
// door listens with the configured backlog (default 4096, capped by net.core.somaxconn). With the
// old fixed backlog of 100, 256 clients connecting together overflowed the accept queue and each
// dropped SYN cost its client a second. Whether a SYN is dropped depends on timing, so the test
// asserts what makes the burst fit, deterministically: the kernel's own record of the listening
// socket's backlog (what `ss -ltn` shows as Send-Q), and that every client completes.

#include <gtest/gtest.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "client/client.hpp"
#include "node/topology.hpp"
#include "protocol/codec.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/loopback_socket.hpp"

namespace troupe::test {
namespace {

int port_of(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

// The accept-queue bound the kernel applies to the IPv4 TCP socket listening on `port`, asked
// of the kernel through sock_diag (for a listener, inet_diag's wqueue is its backlog); -1 when
// no socket listens there.
int listen_backlog_of(int port) {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) throw std::runtime_error("listen_backlog_of: no NETLINK_SOCK_DIAG socket");
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } query{};
  query.header.nlmsg_len = sizeof query;
  query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  query.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  query.request.sdiag_family = AF_INET;
  query.request.sdiag_protocol = IPPROTO_TCP;
  query.request.idiag_states = 1u << TCP_LISTEN;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd, &query, sizeof query, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    throw std::runtime_error("listen_backlog_of: sock_diag query failed");
  }
  alignas(nlmsghdr) char buffer[32768];
  for (int datagrams = 0; datagrams < 10000; ++datagrams) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) throw std::runtime_error("listen_backlog_of: no answer from sock_diag");
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) return -1;
      if (h->nlmsg_type == NLMSG_ERROR) throw std::runtime_error("listen_backlog_of: sock_diag answered an error");
      const auto* socket_info = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      if (ntohs(socket_info->id.idiag_sport) == port) return static_cast<int>(socket_info->idiag_wqueue);
    }
  }
  throw std::runtime_error("listen_backlog_of: sock_diag's answer did not end");
}

int somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  return in >> value ? value : 1 << 30;
}

// `num_clients` DEALER sockets connect at once, each sends one short request, and each must get
// its whole completion back. Returns the ids that failed, with what they got.
std::vector<std::string> serve_burst(const std::string& endpoint, int num_clients) {
  zmq::context_t context(1);
  std::vector<zmq::socket_t> sockets;
  sockets.reserve(num_clients);
  for (int i = 0; i < num_clients; ++i) {
    auto& s = sockets.emplace_back(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
  }
  // Connect all before anything is sent: libzmq's I/O thread then opens the connections together.
  for (auto& s : sockets) s.connect(endpoint);
  for (int i = 0; i < num_clients; ++i) {
    generate_request r;
    r.id = "burst-" + std::to_string(i);
    r.prompt = "Once upon a time";
    r.stream = false;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 4;
    const std::string frame = encode_request(r);
    (void)sockets[i].send(zmq::buffer(frame), zmq::send_flags::none);
  }
  std::vector<std::string> outcome(num_clients);  // empty: no reply yet
  std::vector<zmq::pollitem_t> items;
  for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  int num_answered = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);  // 2 shared cores
  while (num_answered < num_clients && std::chrono::steady_clock::now() < deadline) {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(200));
    for (int i = 0; i < num_clients; ++i) {
      if (!(items[i].revents & ZMQ_POLLIN) || !outcome[i].empty()) continue;
      zmq::message_t message;
      if (!sockets[i].recv(message, zmq::recv_flags::dontwait)) continue;
      const server_reply reply = decode_reply(message.to_string_view());
      if (const auto* d = std::get_if<delta_reply>(&reply)) {
        outcome[i] = d->id == "burst-" + std::to_string(i) && d->finish_reason == "length" && d->token_ids.size() == 4
                         ? "ok"
                         : "a wrong completion: '" + d->id + "' " + d->finish_reason.value_or("(unfinished)");
      } else if (const auto* e = std::get_if<error_reply>(&reply)) {
        outcome[i] = "error: " + e->message;
      } else {
        outcome[i] = "a stats reply";
      }
      ++num_answered;
    }
  }
  std::vector<std::string> failures;
  for (int i = 0; i < num_clients; ++i) {
    if (outcome[i] != "ok") {
      failures.push_back("burst-" + std::to_string(i) + ": " + (outcome[i].empty() ? "no reply" : outcome[i]));
    }
  }
  return failures;
}

TEST(serve_connection_burst, the_default_backlog_fits_256_clients_and_every_one_is_served) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  constexpr int num_clients = 256;
  const int expected = std::min(topology{}.listen_backlog, somaxconn());
  ASSERT_GT(expected, num_clients) << "net.core.somaxconn = " << somaxconn()
                                   << " caps the backlog below this burst; raise it to run this test";
  serve_process server({});
  EXPECT_EQ(listen_backlog_of(port_of(server.endpoint())), expected)
      << "the ZeroMQ port's accept queue is not the configured backlog (capped by net.core.somaxconn)";
  const auto failures = serve_burst(server.endpoint(), num_clients);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << num_clients
                                << " clients failed, first: " << (failures.empty() ? "" : failures.front());
  EXPECT_TRUE(server.alive());
}

TEST(serve_connection_burst, listen_backlog_sets_the_accept_queue) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  const int wanted = std::min(300, somaxconn());
  serve_process server({"--listen-backlog", std::to_string(wanted)});
  EXPECT_EQ(listen_backlog_of(port_of(server.endpoint())), wanted);
}

// True when the server closed `fd` (end of stream or reset) within `within_ms`.
bool closed_by_server(int fd, int within_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, within_ms) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

// The client doors' caps from the command line (issue 25: they had no keys nor flags). With 2
// pending slots on the ZeroMQ door and 16 waiting connections on the HTTP door, one more silent
// connection than that closes the oldest at once, long before the 60 s deadlines; with the
// defaults (64 and a quarter of the open-files limit) none would be.
TEST(serve_connection_burst, the_doors_caps_are_set_by_flags) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  serve_process server({"--zmq-max-pending-handshakes", "2", "--zmq-max-connections", "6", "--zmq-handshake-timeout-ms",
                        "60000", "--http-port", "0", "--http-max-waiting-connections", "16",
                        "--http-request-timeout-ms", "60000"});
  ASSERT_TRUE(server.alive());
  auto flood = [](int port, int count) {
    std::vector<int> fds;
    for (int i = 0; i < count; ++i) {
      fds.push_back(testing::connect_loopback(static_cast<uint16_t>(port)));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // accepted in this order
    }
    return fds;
  };
  const std::vector<int> zmq = flood(port_of(server.endpoint()), 3);
  EXPECT_TRUE(closed_by_server(zmq[0], 3000)) << "the oldest of 3 silent connections stayed with 2 pending slots";
  EXPECT_FALSE(closed_by_server(zmq[2], 100));
  const std::vector<int> http = flood(server.http_port(), 17);
  EXPECT_TRUE(closed_by_server(http[0], 3000)) << "the longest waiting of 17 stayed with 16 waiting slots";
  EXPECT_FALSE(closed_by_server(http[16], 100));
  for (int fd : zmq) ::close(fd);
  for (int fd : http) ::close(fd);
  EXPECT_TRUE(server.alive());
}

// A door at its connection limit closes each new connection at once; the client says that is what
// happened (a server turned it away, not "is it running?"). Once the slot is free it is served.
TEST(serve_connection_burst, a_client_turned_away_at_the_connection_limit_is_told_so) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  serve_process server(
      {"--zmq-max-pending-handshakes", "1", "--zmq-max-connections", "1", "--zmq-handshake-timeout-ms", "60000"});
  ASSERT_TRUE(server.alive());
  const int held = testing::connect_loopback(static_cast<uint16_t>(port_of(server.endpoint())));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted: the one slot is taken
  std::string message;
  {
    client turned_away(server.endpoint());
    turned_away.set_connect_timeout(std::chrono::milliseconds(2000));
    try {
      turned_away.stats();
    } catch (const client_unreachable& e) {
      message = e.what();
    }
  }
  EXPECT_NE(message.find("it closed the connection before the ZeroMQ handshake finished"), std::string::npos)
      << message;
  EXPECT_NE(message.find("connection limit"), std::string::npos) << message;
  ::close(held);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  client served(server.endpoint());
  served.set_timeout(std::chrono::seconds(30));
  EXPECT_NO_THROW(served.stats());
  EXPECT_TRUE(server.alive());
}
}  // namespace
}  // namespace troupe::test
