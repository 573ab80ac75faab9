// The HTTP door at its edges (issue 25): an API key followed by a NUL byte, a Content-Length over
// the body bound with no body behind it, and a stop() right after start().

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

#include <gtest/gtest.h>

#include "doors/http_door.hpp"
#include "tests/loopback_socket.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

// Answers nothing: these tests never reach the engine.
class silent_downstream : public door_downstream {
 public:
  void submit(tokenize_request) override {}
  void abort(int64_t) override {}
  void query_stats(uint64_t) override {}
  void query_trace(uint64_t, duration_ns) override {}
};

struct door_under_test {
  silent_downstream downstream;
  request_admission admission{8};
  serving_counters counters;
  std::unique_ptr<http_door> door;

  explicit door_under_test(std::string api_key = {}) {
    http_options options;
    options.port = 0;
    options.api_key = std::move(api_key);
    options.model_name = "tiny";
    options.max_connections = 8;
    options.max_body_bytes = 1 << 20;
    options.request_timeout_ms = 10000;
    options.limits.max_model_len = 64;
    door = std::make_unique<http_door>(options, downstream, admission, counters, [](int32_t) { return ""; });
    door->start();
  }
  ~door_under_test() { door->stop(); }
};

// Sends `request` as raw bytes; the status of the first response line (0 if none within `within`).
int raw_status(int port, const std::string& request, std::chrono::milliseconds within) {
  const int fd = testing::connect_loopback(static_cast<uint16_t>(port));
  if (fd < 0) return 0;
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (reply.find("\r\n") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) continue;
    char buffer[512];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  if (reply.rfind("HTTP/1.1 ", 0) != 0 || reply.size() < 12) return 0;
  return std::stoi(reply.substr(9, 3));
}

TEST(http_door_edges, an_api_key_is_compared_whole_past_a_nul_byte) {
  door_under_test d("k");
  const auto with_key = [&](const std::string& value) {
    return raw_status(d.door->port(),
                      "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + "\r\nConnection: close\r\n\r\n",
                      5s);
  };
  EXPECT_EQ(with_key("Bearer k"), 200);
  EXPECT_EQ(with_key("Bearer kjunk"), 401);
  EXPECT_EQ(with_key(std::string("Bearer k\0junk", 13)), 401) << "the key was read up to the NUL only";
  EXPECT_EQ(with_key(std::string("Bearer k\0", 9)), 401);
}

TEST(http_door_edges, a_content_length_over_the_bound_gets_413_at_once) {
  door_under_test d;
  const auto start = std::chrono::steady_clock::now();
  const int status = raw_status(d.door->port(),
                                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "content-length: 67108864\r\n\r\n",
                                5s);
  EXPECT_EQ(status, 413);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "answered only after the request timeout";
  // A huge number (more digits than 64 bits hold) is over the bound too.
  EXPECT_EQ(
      raw_status(d.door->port(),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 5s),
      413);
  // Within the bound the body is still read: a bad JSON body is the door's 400, not a 413.
  EXPECT_EQ(raw_status(d.door->port(),
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 5\r\nConnection: close\r\n\r\n{bad}",
                       5s),
            400);
}

TEST(http_door_edges, stop_right_after_start_always_returns) {
  // A stop() before cpp-httplib's accept loop ran left the loop running and the join waiting
  // forever (SIGTERM right after `serving on`: 8 of 60 launches hung). Each start/stop pair must
  // end well within a second.
  auto cycles = std::async(std::launch::async, [] {
    for (int i = 0; i < 200; ++i) door_under_test d;
  });
  if (cycles.wait_for(60s) != std::future_status::ready) {
    ADD_FAILURE() << "a stop() right after start() hangs";
    std::_Exit(1);  // the stuck door's thread cannot be joined; end here rather than hang the suite
  }
}

}  // namespace
}  // namespace troupe
