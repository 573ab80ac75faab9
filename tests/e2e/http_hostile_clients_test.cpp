// The HTTP door against the clients a fuzzing attacker writes (issue 9), each driving the real
// `troupe serve` on stories260K over raw sockets: slowloris connections that send a request a
// byte at a time must not starve /health; a header flood gets 431 without the server's memory
// growing with it; pipelined requests on one connection are each answered, in order.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// A client socket to 127.0.0.1, closed when it goes out of scope.
class raw_connection {
 public:
  raw_connection() = default;
  explicit raw_connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) close();
  }
  ~raw_connection() { close(); }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;
  raw_connection(raw_connection&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  raw_connection& operator=(raw_connection&& other) noexcept {
    close();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }

  bool open() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(std::string_view bytes) {
    while (!bytes.empty() && fd_ >= 0) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return fd_ >= 0;
  }
  // Whether the server has sent something (or closed) without waiting.
  bool has_reply() const {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  // Everything the server sends until it closes or `within` passes.
  std::string read_until_closed(std::chrono::milliseconds within) {
    std::string out;
    const auto deadline = steady::now() + within;
    char block[65536];
    while (fd_ >= 0 && steady::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (::poll(&p, 1, static_cast<int>(std::max<long>(1, left.count()))) <= 0) continue;
      const ssize_t n = ::recv(fd_, block, sizeof block, 0);
      if (n <= 0) break;
      out.append(block, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  int fd_ = -1;
};

// `troupe serve` with its HTTP door on a port it chose itself (read from its log).
struct http_server {
  serve_process process;
  int http_port;

  explicit http_server(std::vector<std::string> extra = {})
      : process(with_http(std::move(extra))), http_port(process.http_port()) {
    httplib::Client c("127.0.0.1", http_port);
    for (int i = 0; i < 100; ++i) {
      if (auto res = c.Get("/health"); res && res->status == 200) return;
      std::this_thread::sleep_for(50ms);
    }
    throw std::runtime_error("the HTTP API did not come up on port " + std::to_string(http_port));
  }
  static std::vector<std::string> with_http(std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--http-port", "0", "--served-model-name", "stories260K"});
    return extra;
  }

  pid_t pid() const { return process.pid(); }

  // The resident memory of the server, in KiB.
  long rss_kib() const {
    std::ifstream status("/proc/" + std::to_string(pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

  bool healthy() const {
    httplib::Client c("127.0.0.1", http_port);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(1, 0);
    auto res = c.Get("/health");
    return res && res->status == 200;
  }
};

// The HTTP responses in `bytes`, each as status and body (bodies by Content-Length).
std::vector<std::pair<int, std::string>> split_responses(std::string_view bytes) {
  std::vector<std::pair<int, std::string>> out;
  while (bytes.rfind("HTTP/1.1 ", 0) == 0) {
    const size_t head_end = bytes.find("\r\n\r\n");
    if (head_end == std::string_view::npos) break;
    const std::string head(bytes.substr(0, head_end));
    int status = 0;
    std::from_chars(head.data() + 9, head.data() + 12, status);
    size_t length = 0;
    const size_t at = head.find("Content-Length: ");
    if (at != std::string::npos) length = std::stoul(head.substr(at + 16));
    if (bytes.size() < head_end + 4 + length) break;
    out.emplace_back(status, std::string(bytes.substr(head_end + 4, length)));
    bytes.remove_prefix(head_end + 4 + length);
  }
  return out;
}

#define REQUIRE_MODEL() \
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir

TEST(http_hostile_clients, slowloris_connections_do_not_starve_health) {
  REQUIRE_MODEL();
  // 56 worker threads for anything, 8 kept for probes: the attackers sending bodies slowly
  // outnumber the first.
  http_server server({"--http-request-timeout-ms", "1000", "--http-max-connections", "64"});
  constexpr int num_attackers = 300;
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 64\r\nX-Padding: " +
      std::string(200, 'a') + "\r\n\r\n";
  const std::string request = head + std::string(64, ' ');
  std::atomic<bool> attacking{true};
  std::atomic<int> num_cut_off{0};  // attacking connections the server closed
  std::thread attacker([&] {
    // Each connection sends its request one byte every 200 ms (odd ones send the headers at
    // once, then the body so), and reconnects once cut off.
    std::vector<raw_connection> connections(num_attackers);
    std::vector<size_t> num_sent(num_attackers, 0);
    auto connect = [&](size_t i) {
      connections[i] = raw_connection(server.http_port);
      num_sent[i] = i % 2 == 1 && connections[i].send_all(head) ? head.size() : 0;
    };
    for (size_t i = 0; i < num_attackers; ++i) connect(i);
    for (int tick = 0; tick < 100 && attacking; ++tick) {  // 20 s at most
      for (int i = 0; i < num_attackers && attacking; ++i) {
        auto& c = connections[static_cast<size_t>(i)];
        if (c.open() && c.has_reply()) {
          ++num_cut_off;
          c.close();
        }
        if (!c.open() || num_sent[static_cast<size_t>(i)] == request.size()) connect(static_cast<size_t>(i));
        if (c.send_all(std::string_view(request).substr(num_sent[static_cast<size_t>(i)], 1))) {
          ++num_sent[static_cast<size_t>(i)];
        }
      }
      std::this_thread::sleep_for(200ms);
    }
  });
  struct stop_attack {
    std::atomic<bool>& attacking;
    std::thread& attacker;
    ~stop_attack() {
      attacking = false;
      if (attacker.joinable()) attacker.join();
    }
  } stop{attacking, attacker};

  // Probes, each on a connection of its own as a load balancer's, while every attacker holds
  // a connection: every half second for 3 s.
  std::this_thread::sleep_for(500ms);
  int num_probes = 0, num_answered = 0;
  for (; num_probes < 6; ++num_probes) {
    const auto started = steady::now();
    if (server.healthy()) ++num_answered;
    std::this_thread::sleep_until(started + 500ms);
  }
  attacking = false;
  attacker.join();

  EXPECT_GE(num_answered, num_probes - 1)
      << "/health answered " << num_answered << " of " << num_probes << " probes during the attack";
  EXPECT_GT(num_cut_off.load(), num_attackers / 2) << "slow requests are cut off at the request timeout";
  EXPECT_TRUE(server.healthy());
}

TEST(http_hostile_clients, header_flood_gets_431_without_the_server_growing) {
  REQUIRE_MODEL();
  http_server server;
  const long rss_before = server.rss_kib();
  ASSERT_GT(rss_before, 0);

  raw_connection flood(server.http_port);
  ASSERT_TRUE(flood.open());
  ASSERT_TRUE(flood.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  // 64 MiB of 8,000-byte header lines (each under httplib's own 8 KiB line bound), stopped
  // as soon as the server answers or closes.
  const std::string filler(8000 - 16, 'x');
  constexpr size_t flood_bytes = 64u << 20;
  size_t num_sent = 0;
  for (int line = 0; num_sent < flood_bytes && !flood.has_reply(); ++line) {
    const std::string header = "X-Flood-" + std::to_string(100000 + line) + ": " + filler + "\r\n";
    if (!flood.send_all(header)) break;
    num_sent += header.size();
  }
  if (num_sent >= flood_bytes) flood.send_all("\r\n");
  const std::string reply = flood.read_until_closed(10s);
  const long rss_after = server.rss_kib();

  ASSERT_FALSE(reply.empty()) << "no reply after " << num_sent << " bytes of headers";
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 431") << reply.substr(0, 200);
  EXPECT_NE(reply.find("Connection: close"), std::string::npos);
  EXPECT_NE(reply.find("exceed 65536 bytes"), std::string::npos) << reply;
  EXPECT_LT(num_sent, flood_bytes / 4) << "the server read the flood on instead of answering";
  EXPECT_LT(rss_after - rss_before, 8 * 1024) << "RSS grew from " << rss_before << " KiB to " << rss_after << " KiB";
  EXPECT_TRUE(server.healthy()) << "the server goes on serving";
  httplib::Client c("127.0.0.1", server.http_port);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("troupe_http_responses_total{code=\"4xx\"} 1\n"), std::string::npos)
      << "the 431 is counted: " << metrics->body;
}

TEST(http_hostile_clients, pipelined_requests_are_answered_in_order) {
  REQUIRE_MODEL();
  http_server server;
  const std::string body =
      R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";
  const std::string requests =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body +
      "GET /v1/models/no-such-model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  raw_connection c(server.http_port);
  ASSERT_TRUE(c.open());
  ASSERT_TRUE(c.send_all(requests));  // in one write
  const auto responses = split_responses(c.read_until_closed(20s));

  ASSERT_EQ(responses.size(), 3u) << "answered " << responses.size() << " of 3 pipelined requests";
  EXPECT_EQ(responses[0].first, 200) << responses[0].second;
  const auto completion = nlohmann::json::parse(responses[0].second);
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["usage"]["completion_tokens"], 4);
  EXPECT_EQ(responses[1].first, 404);
  EXPECT_NE(responses[1].second.find("no-such-model"), std::string::npos) << responses[1].second;
  EXPECT_EQ(responses[2].first, 200);
  EXPECT_EQ(responses[2].second, R"({"status":"ok"})");
}

TEST(http_hostile_clients, a_body_sent_too_slowly_gets_408) {
  REQUIRE_MODEL();
  http_server server({"--http-request-timeout-ms", "1000"});
  raw_connection c(server.http_port);
  ASSERT_TRUE(c.open());
  ASSERT_TRUE(
      c.send_all("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100\r\n\r\n{"));
  // The rest of the body a byte each 200 ms: it would take 20 s.
  std::string reply;
  for (int i = 0; i < 40 && !c.has_reply(); ++i) {
    std::this_thread::sleep_for(200ms);
    if (!c.send_all(" ")) break;
  }
  reply = c.read_until_closed(5s);
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 408") << reply.substr(0, 200);
  EXPECT_NE(reply.find("within 1000 ms"), std::string::npos) << reply;
  EXPECT_TRUE(server.healthy());
}

}  // namespace
}  // namespace troupe::test
