// Peers that do not speak ZMTP/3 to the ZeroMQ port: an old ZMTP/1.0 greeting, random bytes, a
// greeting cut short. None of them may end the server (each once aborted it: the door asked
// their messages for a source descriptor they do not carry, and nothing caught the throw), and
// a ZMTP/1.0 peer's request is served like any other.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>

#include "protocol/codec.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

int port_of(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

// A plain TCP connection to 127.0.0.1, closed when it goes out of scope.
class raw_connection {
 public:
  explicit raw_connection(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0) throw std::runtime_error("raw_connection: socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      throw std::runtime_error("raw_connection: cannot connect to 127.0.0.1:" + std::to_string(port));
    }
  }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;
  ~raw_connection() { ::close(fd_); }

  void send_bytes(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("raw_connection: send failed after " + std::to_string(sent) + " bytes");
      sent += static_cast<size_t>(n);
    }
  }

  // Exactly `count` bytes, or fewer when the server closes the connection or `within` passes.
  std::string receive(size_t count, std::chrono::milliseconds within) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + within;
    while (out.size() < count) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, std::min(sizeof buffer, count - out.size()), 0);
      if (n <= 0) break;  // closed (the server died, or dropped this peer)
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }

  // Reads and drops what the server sends until it closes the connection or `within` passes, so
  // the server has handled what was sent before the test goes on.
  void drain(std::chrono::milliseconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    for (int i = 0; i < 1000 && std::chrono::steady_clock::now() < deadline; ++i) {
      if (receive(4096, std::chrono::milliseconds(100)).empty()) return;
    }
  }

 private:
  int fd_;
};

// One ZMTP/1.0 frame: length (of flags and body) in one byte, or 0xFF and eight bytes big-endian;
// then the flags (0: last part) and the body.
std::string zmtp1_frame(const std::string& body) {
  std::string out;
  const uint64_t length = body.size() + 1;
  if (length < 255) {
    out += static_cast<char>(length);
  } else {
    out += '\xff';
    for (int shift = 56; shift >= 0; shift -= 8) out += static_cast<char>((length >> shift) & 0xff);
  }
  out += '\0';
  return out + body;
}

// What libzmq sends a ZMTP/1.0 peer first: its greeting's signature, which doubles as the
// ZMTP/1.0 header of an empty routing-id frame (0xFF, length 1 in eight bytes, flags 0x7F).
constexpr size_t zmtp1_server_greeting_bytes = 10;

// The body of one ZMTP/1.0 frame from the server, after its greeting; empty when none came.
std::string receive_zmtp1_reply(raw_connection& c, std::chrono::milliseconds within) {
  const std::string greeting = c.receive(zmtp1_server_greeting_bytes, within);
  if (greeting.size() < zmtp1_server_greeting_bytes) return {};
  std::string head = c.receive(1, within);
  if (head.empty()) return {};
  uint64_t length = static_cast<unsigned char>(head[0]);
  if (length == 0xff) {
    const std::string wide = c.receive(8, within);
    if (wide.size() < 8) return {};
    length = 0;
    for (char ch : wide) length = (length << 8) | static_cast<unsigned char>(ch);
  }
  if (length < 1 || length > (1u << 20)) return {};
  const std::string flags_and_body = c.receive(length, within);
  return flags_and_body.size() == length ? flags_and_body.substr(1) : std::string{};
}

TEST(serve_hostile_peers, old_protocols_and_garbage_never_end_the_server) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  serve_process server({});
  const int port = port_of(server.endpoint());
  const auto within = std::chrono::seconds(20);  // generous: 2 cores shared with builds

  {
    // The old ZMTP/1.0 greeting: an empty routing id, then an empty message, which is answered
    // like any malformed request.
    raw_connection old_peer(port);
    old_peer.send_bytes(std::string("\x01\x00\x01\x00", 4));
    const std::string reply = receive_zmtp1_reply(old_peer, within);
    ASSERT_FALSE(reply.empty()) << "no reply to a ZMTP/1.0 peer's empty message (did the server die?)";
    const server_reply decoded = decode_reply(reply);
    const auto* error = std::get_if<error_reply>(&decoded);
    ASSERT_TRUE(error) << "expected an error reply to an empty message";
    EXPECT_EQ(error->code, error_code::bad_request);
  }
  ASSERT_TRUE(server.alive()) << "a ZMTP/1.0 greeting ended the server";

  {
    // A ZMTP/1.0 peer with a real request: served, although its connection is not watched.
    generate_request request;
    request.id = "old-1";
    request.prompt = "Once upon a time";
    request.stream = false;
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = 8;
    raw_connection old_peer(port);
    old_peer.send_bytes(zmtp1_frame("") + zmtp1_frame(encode_request(request)));
    const std::string reply = receive_zmtp1_reply(old_peer, within);
    ASSERT_FALSE(reply.empty()) << "no reply to a ZMTP/1.0 peer's request (did the server die?)";
    const server_reply decoded = decode_reply(reply);
    const auto* delta = std::get_if<delta_reply>(&decoded);
    ASSERT_TRUE(delta) << "expected the completion, got "
                       << (std::holds_alternative<error_reply>(decoded) ? std::get<error_reply>(decoded).message
                                                                        : "stats");
    EXPECT_EQ(delta->id, "old-1");
    EXPECT_EQ(delta->finish_reason, "length");
    EXPECT_EQ(delta->token_ids.size(), 8u);
  }
  ASSERT_TRUE(server.alive()) << "a ZMTP/1.0 request ended the server";

  // Random bytes, some starting like a ZMTP/3 greeting (0xFF) and some not (taken for ZMTP/1.0).
  std::mt19937 rng(20261124);
  for (int i = 0; i < 8; ++i) {
    std::string noise(1024, '\0');
    for (auto& ch : noise) ch = static_cast<char>(rng());
    noise[0] = i % 2 ? '\xff' : static_cast<char>(1 + i);
    raw_connection peer(port);
    peer.send_bytes(noise);
    peer.drain(std::chrono::seconds(2));
    ASSERT_TRUE(server.alive()) << "1 KiB of random bytes (seed 20261124, blob " << i << ") ended the server";
  }

  {
    // A ZMTP/3 greeting cut short, the connection then closed.
    raw_connection peer(port);
    peer.send_bytes(std::string("\xff\0\0\0\0\0\0\0\x01\x7f\x03", 11));
    peer.drain(std::chrono::milliseconds(500));
  }

  // Through all that, a normal client is still served.
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  const completion out = c.generate(greedy("Once upon a time", 8));
  EXPECT_EQ(out.finish_reason, "length");
  EXPECT_EQ(out.token_ids.size(), 8u);
  EXPECT_TRUE(server.alive());
}

}  // namespace
}  // namespace troupe::test
