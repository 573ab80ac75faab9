// The pieces that stand between a client's socket and cpp-httplib: where a request's header
// block ends, which requests are probes, the reception that waits for a header block under a
// deadline and a byte bound, the stream that carries pipelined bytes over, and the workers that
// keep threads for probes. Sockets are socketpairs; every wait is bounded.

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>

#include "doors/http/connection_stream.hpp"
#include "doors/http/connection_workers.hpp"
#include "doors/http/request_reception.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

// A connected pair: the server's end is handed over, the client's closed at the end.
struct socket_pair {
  int server = -1, client = -1;
  socket_pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0) server = fds[0], client = fds[1];
  }
  ~socket_pair() {
    if (client >= 0) ::close(client);
  }
  void send(std::string_view bytes) const {
    ASSERT_EQ(::send(client, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
  }
  // What the server wrote, within `within`.
  std::string reply(std::chrono::milliseconds within = 10s) const {
    pollfd p{client, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return {};
    char block[4096];
    const ssize_t n = ::recv(client, block, sizeof block, 0);
    return n > 0 ? std::string(block, static_cast<size_t>(n)) : std::string();
  }
};

TEST(header_block_end, finds_the_blank_line_also_across_pieces) {
  EXPECT_EQ(header_block_end("GET / HTTP/1.1\r\nHost: x\r\n\r\nrest"), 27u);
  EXPECT_EQ(header_block_end("GET / HTTP/1.1\r\nHost: x\r\n"), std::string_view::npos);
  EXPECT_EQ(header_block_end("GET / HTTP/1.1\r\n\r\n"), 18u);
  // Searched from where the last piece ended: the blank line straddles it.
  EXPECT_EQ(header_block_end("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 26), 27u);
  // A bare LF does not end a line for httplib, so "\n\n" does not end the block.
  EXPECT_EQ(header_block_end("GET / HTTP/1.1\nHost: x\n\n"), std::string_view::npos);
}

TEST(is_probe, only_gets_of_health_and_metrics) {
  EXPECT_TRUE(is_probe("GET /health HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(is_probe("GET /metrics HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(is_probe("GET /health?verbose=1 HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(is_probe("GET /healthz HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(is_probe("POST /health HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(is_probe("GET /v1/models HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(is_probe("GET /health"));
}

struct reception_fixture {
  std::promise<http_connection> ready;
  std::atomic<int> num_ready{0};
  request_reception reception;

  explicit reception_fixture(reception_options options)
      : reception(options, [this](http_connection c) {
          if (num_ready++ == 0) ready.set_value(std::move(c));
        }) {
    reception.start();
  }
};

TEST(request_reception, hands_over_a_header_block_sent_in_pieces_with_the_bytes_after_it) {
  reception_fixture f({});
  socket_pair pair;
  auto ready = f.ready.get_future();
  f.reception.add_new(pair.server);
  pair.send("GET /health HTTP/1.1\r\nHo");
  pair.send("st: x\r\n\r\nGET /next");
  ASSERT_EQ(ready.wait_for(10s), std::future_status::ready);
  http_connection c = ready.get();
  EXPECT_EQ(c.fd, pair.server);
  EXPECT_EQ(c.pending, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /next");
  close_connection(c);
}

// Connections accepted faster than the reception's thread takes them wait in a queue bounded like
// the reception itself: the oldest is closed at once, not when the thread gets to it.
TEST(request_reception, connections_queued_for_its_thread_are_bounded_too) {
  reception_options options;
  options.max_connections = 8;
  request_reception reception(
      options, [](http_connection c) { close_connection(c); });  // not started: its thread never takes them
  std::vector<std::unique_ptr<socket_pair>> pairs;
  for (int i = 0; i < 50; ++i) {
    pairs.push_back(std::make_unique<socket_pair>());
    reception.add_new(pairs.back()->server);
  }
  int num_closed = 0;
  for (auto& p : pairs) {
    pollfd poll_fd{p->client, POLLIN, 0};
    char byte;
    num_closed += ::poll(&poll_fd, 1, 0) > 0 && ::recv(p->client, &byte, 1, MSG_DONTWAIT) == 0 ? 1 : 0;
  }
  EXPECT_EQ(num_closed, 42);
}

TEST(request_reception, a_kept_connection_whose_next_request_is_in_goes_straight_on) {
  reception_fixture f({});
  socket_pair pair;
  auto ready = f.ready.get_future();
  http_connection kept;
  kept.fd = pair.server;
  kept.pending = "GET /metrics HTTP/1.1\r\n\r\n";
  f.reception.add_kept(std::move(kept));
  ASSERT_EQ(ready.wait_for(10s), std::future_status::ready);
  http_connection c = ready.get();
  EXPECT_EQ(c.pending, "GET /metrics HTTP/1.1\r\n\r\n");
  close_connection(c);
}

TEST(request_reception, headers_past_the_bound_get_431_and_are_not_handed_over) {
  reception_options options;
  options.max_header_bytes = 1024;
  reception_fixture f(options);
  socket_pair pair;
  f.reception.add_new(pair.server);
  pair.send("GET /health HTTP/1.1\r\n");
  for (int i = 0; i < 20; ++i) pair.send("X-Filler: " + std::string(100, 'a') + "\r\n");
  const std::string reply = pair.reply();
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 431") << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  EXPECT_NE(reply.find("exceed 1024 bytes"), std::string::npos) << reply;
  EXPECT_EQ(f.num_ready, 0);
}

TEST(request_reception, headers_not_in_by_the_deadline_get_408) {
  reception_options options;
  options.request_timeout = 100ms;
  reception_fixture f(options);
  socket_pair pair;
  f.reception.add_new(pair.server);
  pair.send("GET /health HTT");
  const std::string reply = pair.reply();
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 408") << reply;
  EXPECT_NE(reply.find("within 100 ms"), std::string::npos) << reply;
  EXPECT_EQ(f.num_ready, 0);
}

TEST(connection_stream, carries_bytes_past_a_request_over_to_the_next) {
  socket_pair pair;
  std::atomic<bool> stopping{false};
  http_connection c;
  c.fd = pair.server;
  c.pending = "first|second";
  c.deadline = std::chrono::steady_clock::now() + 10s;
  const std::string timeout_body = "{}";
  connection_stream stream(std::move(c), 1s, stopping, timeout_body);
  char buffer[6];
  ASSERT_EQ(stream.read(buffer, sizeof buffer), 6);
  EXPECT_EQ(std::string(buffer, 6), "first|");
  http_connection back = stream.release();
  EXPECT_EQ(back.pending, "second");
  EXPECT_EQ(back.fd, pair.server);
  close_connection(back);
}

TEST(connection_stream, a_read_past_the_deadline_fails_and_sends_408) {
  socket_pair pair;
  std::atomic<bool> stopping{false};
  http_connection c;
  c.fd = pair.server;
  c.deadline = std::chrono::steady_clock::now() + 50ms;
  const std::string timeout_body = R"({"error":"late"})";
  connection_stream stream(std::move(c), 1s, stopping, timeout_body);
  char byte;
  EXPECT_EQ(stream.read(&byte, 1), -1);
  EXPECT_TRUE(stream.timed_out());
  EXPECT_EQ(stream.write("x", 1), -1) << "nothing may follow the 408";
  const std::string reply = pair.reply();
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 408") << reply;
  EXPECT_NE(reply.find(R"({"error":"late"})"), std::string::npos) << reply;
}

TEST(connection_workers, a_probe_is_served_while_every_other_thread_is_busy) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> probe_served;
  std::atomic<int> num_others_started{0};
  connection_workers workers(3, 1, [&](http_connection c) {
    if (is_probe(c.pending)) {
      probe_served.set_value();
    } else {
      ++num_others_started;
      released.wait_for(10s);
    }
    close_connection(c);
  });
  auto submit = [&](std::string head) {
    http_connection c;
    c.pending = std::move(head);
    workers.submit(std::move(c));
  };
  for (int i = 0; i < 3; ++i) submit("POST /v1/completions HTTP/1.1\r\n\r\n");  // two run, one queued
  submit("GET /health HTTP/1.1\r\n\r\n");
  auto served = probe_served.get_future();
  EXPECT_EQ(served.wait_for(10s), std::future_status::ready);
  EXPECT_LE(num_others_started.load(), 2) << "the reserved thread took a request that is not a probe";
  release.set_value();
  workers.stop();
}

TEST(connection_workers, a_wait_for_a_free_thread_does_not_count_against_the_deadline) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<steady_time> second_deadline;
  std::atomic<int> num_served{0};
  connection_workers workers(1, 0, [&](http_connection c) {
    if (num_served++ == 0) {
      released.wait_for(10s);
    } else {
      second_deadline.set_value(c.deadline);
    }
  });
  workers.submit(http_connection{});
  http_connection second;
  const steady_time deadline = std::chrono::steady_clock::now() + 100ms;
  second.deadline = deadline;
  workers.submit(std::move(second));
  const auto submitted = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(50ms);
  const auto released_at = std::chrono::steady_clock::now();
  release.set_value();
  auto seen = second_deadline.get_future();
  ASSERT_EQ(seen.wait_for(10s), std::future_status::ready);
  EXPECT_GE(seen.get() - deadline, released_at - submitted) << "the time queued is added to the deadline";
  workers.stop();
}

}  // namespace
}  // namespace troupe
