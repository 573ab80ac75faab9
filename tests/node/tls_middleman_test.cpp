// The cluster's TLS plane (node/tls_middleman.hpp) against hostile peers, in process: members of
// one CA reach each other (also from CAF's own OpenSSL module), a stranger is refused, plain TCP
// connections that never start TLS are closed at their handshake deadline and cannot keep a
// member out, and an insider that announces a huge CAF message is cut off before anything of
// that size is allocated (issue 25 items 1 and 4).

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <gtest/gtest.h>
#include <openssl/ssl.h>

#include "node/cluster_credentials.hpp"
#include "node/tls_context.hpp"
#include "node/tls_middleman.hpp"
#include "tests/loopback_socket.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

using troupe::testing::scratch_dir;
using namespace std::chrono_literals;

struct plane_config : caf::actor_system_config {
  plane_config() {
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
  }
};

// A member's actor system with the TLS plane.
struct member {
  plane_config config;
  caf::actor_system system{config};
  tls_middleman tls;
  member(const member_credentials& files, const tls_limits& limits) : tls(system, files, limits) {}
};

caf::behavior echo(caf::event_based_actor*) {
  return {[](int32_t x) { return x + 1; }};
}

int32_t ask(caf::actor_system& system, const caf::actor& whom) {
  caf::scoped_actor self(system);
  int32_t answer = 0;
  self->request(whom, std::chrono::seconds(10), int32_t{41})
      .receive([&](int32_t x) { answer = x; }, [&](caf::error& e) { ADD_FAILURE() << system.render(e); });
  return answer;
}

// True when the server closes the connection within `within` (its end of the stream or a reset).
bool closed_by_peer(int fd, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left.count()))) != 1) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n <= 0) return true;  // 0: end of stream; -1: reset
  }
  return false;
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

class tls_middleman_test : public ::testing::Test {
 protected:
  void SetUp() override {
    make_cluster_ca(ours.path(), "ours", 2);
    make_cluster_ca(theirs.path(), "theirs", 2);
    node_files = issue_member_certificate(ours.path(), "node", 1);
    controller_files = issue_member_certificate(ours.path(), "controller", 1);
    stranger_files = issue_member_certificate(theirs.path(), "intruder", 1);
    stranger_files.ca_certificate = ours.path() / "ca.crt";  // it trusts us; we must refuse it
    limits.connections.handshake_timeout = 400ms;
    limits.connections.max_pending = 8;
    limits.connections.max_connections = 64;
    limits.max_message_bytes = size_t(1) << 20;
    node = std::make_unique<member>(node_files, limits);
    published = node->system.spawn(echo);
    auto bound = tls_publish(node->system, published, 0, "127.0.0.1");
    ASSERT_TRUE(bound) << node->system.render(bound.error());
    port = *bound;
  }
  void TearDown() override {
    caf::anon_send_exit(published, caf::exit_reason::user_shutdown);
    node.reset();
  }

  scratch_dir ours, theirs;
  member_credentials node_files, controller_files, stranger_files;
  tls_limits limits;
  std::unique_ptr<member> node;
  caf::actor published;
  uint16_t port = 0;
};

TEST_F(tls_middleman_test, members_connect_and_a_stranger_is_refused) {
  {
    member controller(controller_files, limits);
    auto remote = tls_remote_actor(controller.system, "127.0.0.1", port, 5s);
    ASSERT_TRUE(remote) << controller.system.render(remote.error());
    EXPECT_EQ(ask(controller.system, *remote), 42);
  }
  {
    // CAF's own OpenSSL module speaks the same TLS: tools built on it still reach a node.
    struct openssl_config : caf::actor_system_config {
      explicit openssl_config(const member_credentials& files) {
        load<caf::io::middleman>();
        load<caf::openssl::manager>();
        set("logger.console", caf::atom("none"));
        set("openssl.certificate", files.certificate.string());
        set("openssl.key", files.private_key.string());
        set("openssl.cafile", files.ca_certificate.string());
      }
    } config(controller_files);
    caf::actor_system system(config);
    auto remote = caf::openssl::remote_actor(system, "127.0.0.1", port);
    ASSERT_TRUE(remote) << system.render(remote.error());
    EXPECT_EQ(ask(system, *remote), 42);
  }
  {
    member stranger(stranger_files, limits);
    const auto start = std::chrono::steady_clock::now();
    auto remote = tls_remote_actor(stranger.system, "127.0.0.1", port, 5s);
    EXPECT_FALSE(remote) << "a certificate of another CA was accepted";
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  }
  {
    // Nothing listens there: refused within the deadline, not the kernel's retries.
    member controller(controller_files, limits);
    auto remote = tls_remote_actor(controller.system, "127.0.0.1", 1, 5s);
    EXPECT_FALSE(remote);
  }
}

TEST_F(tls_middleman_test, silent_connections_are_closed_at_the_handshake_deadline_and_members_still_get_in) {
  constexpr int num_silent = 60;  // beyond max_pending (8): the oldest are evicted for newer ones
  std::vector<int> silent;
  for (int i = 0; i < num_silent; ++i) {
    const int fd = testing::connect_loopback(port);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  // A member connecting in the middle of the flood gets its handshake.
  {
    member controller(controller_files, limits);
    auto remote = tls_remote_actor(controller.system, "127.0.0.1", port, 5s);
    ASSERT_TRUE(remote) << controller.system.render(remote.error());
    EXPECT_EQ(ask(controller.system, *remote), 42);
  }
  int num_closed = 0;
  for (int fd : silent) {
    num_closed += closed_by_peer(fd, 3s) ? 1 : 0;
    ::close(fd);
  }
  EXPECT_EQ(num_closed, num_silent) << "every connection that never started TLS is closed";
  const connection_counts counts = node->tls.counts();
  EXPECT_EQ(counts.num_timed_out + counts.num_evicted, uint64_t(num_silent)) << counts.num_timed_out << " timed out";
  EXPECT_GE(counts.num_timed_out, 1u);
  EXPECT_EQ(counts.num_pending, 0u);
}

TEST_F(tls_middleman_test, an_insider_announcing_a_huge_message_is_cut_off_before_allocation) {
  // A member (a valid certificate) completes TLS by hand and sends one BASP header announcing a
  // 1 GiB payload; CAF would allocate the buffer at once and keep it.
  const tls_context context(controller_files);
  const int fd = testing::connect_loopback(port);
  ASSERT_GE(fd, 0);
  SSL* ssl = context.new_session(fd, false);
  ASSERT_NE(ssl, nullptr);
  ASSERT_EQ(SSL_connect(ssl), 1);
  const size_t before = resident_bytes();
  // operation client_handshake (1), padding, flags, payload_len 2^30, operation_data, source and
  // destination actors: 32 bytes, big-endian as CAF's binary serializer writes them.
  unsigned char header[32] = {};
  header[0] = 1;
  header[4] = 0x40;  // payload_len = 0x40000000
  ASSERT_EQ(SSL_write(ssl, header, sizeof header), int(sizeof header));
  EXPECT_TRUE(closed_by_peer(fd, 3s)) << "the connection stays open, waiting for 1 GiB";
  const size_t after = resident_bytes();
  EXPECT_LT(after, before + (size_t(256) << 20)) << "resident memory grew by " << ((after - before) >> 20) << " MiB";
  SSL_free(ssl);
  ::close(fd);
  // The node serves on.
  member controller(controller_files, limits);
  auto remote = tls_remote_actor(controller.system, "127.0.0.1", port, 5s);
  ASSERT_TRUE(remote) << controller.system.render(remote.error());
  EXPECT_EQ(ask(controller.system, *remote), 42);
}

}  // namespace
}  // namespace troupe
