// A listener's limits: handshake deadlines, the pending slots (the oldest evicted for a newer
// connection), the open-connection cap. Sockets are socketpairs: what the guard shuts down, the
// other end reads as the end of the stream.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "net/connection_guard.hpp"

namespace troupe {
namespace {

struct socket_pair {
  int ours = -1;    // the listener's side, which the guard may shut
  int theirs = -1;  // the peer's side
  socket_pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    ours = fds[0];
    theirs = fds[1];
  }
  ~socket_pair() {
    ::close(ours);
    ::close(theirs);
  }
  // True when the peer's side reads the end of the stream (the guard shut our side down).
  bool peer_sees_end() const {
    pollfd p{theirs, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) return false;
    char byte;
    return ::recv(theirs, &byte, 1, MSG_DONTWAIT) == 0;
  }
};

TEST(connection_guard, a_silent_connection_is_shut_at_its_handshake_deadline) {
  connection_guard guard({4, 8, std::chrono::milliseconds(50)}, "test");
  socket_pair silent, talking;
  const uint64_t a = guard.admit(silent.ours, "silent");
  const uint64_t b = guard.admit(talking.ours, "talking");
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  guard.established(b);
  EXPECT_EQ(guard.expire(), 0u);  // not yet
  EXPECT_FALSE(silent.peer_sees_end());
  std::this_thread::sleep_for(std::chrono::milliseconds(70));
  EXPECT_EQ(guard.expire(), 1u);
  EXPECT_TRUE(silent.peer_sees_end());
  EXPECT_FALSE(talking.peer_sees_end()) << "an established connection has no handshake deadline";
  const connection_counts counts = guard.counts();
  EXPECT_EQ(counts.num_timed_out, 1u);
  EXPECT_EQ(counts.num_pending, 0u);
  EXPECT_EQ(counts.num_established, 1u);
  guard.closed(a);
  guard.closed(b);
  EXPECT_EQ(guard.counts().num_established, 0u);
}

TEST(connection_guard, a_flood_of_pending_connections_evicts_the_oldest_not_the_newest) {
  connection_guard guard({3, 100, std::chrono::seconds(60)}, "test");
  std::vector<socket_pair> pairs(10);
  std::vector<uint64_t> tickets;
  for (auto& p : pairs) tickets.push_back(guard.admit(p.ours, "flood"));
  for (uint64_t t : tickets) EXPECT_NE(t, 0u);
  // The last three are pending; the seven before were shut to make room.
  for (size_t i = 0; i < pairs.size(); ++i) EXPECT_EQ(pairs[i].peer_sees_end(), i < 7) << i;
  EXPECT_EQ(guard.counts().num_evicted, 7u);
  EXPECT_EQ(guard.counts().num_pending, 3u);
  // Their owners close them: nothing is shut twice, the counts come back to zero.
  for (uint64_t t : tickets) guard.closed(t);
  EXPECT_EQ(guard.counts().num_pending, 0u);
  EXPECT_EQ(guard.log().num_lines(), 1u) << "seven evictions in one window are one log line";
}

TEST(connection_guard, beyond_max_connections_a_connection_is_refused) {
  connection_guard guard({2, 3, std::chrono::seconds(60)}, "test");
  std::vector<socket_pair> pairs(5);
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i < 3; ++i) {
    tickets.push_back(guard.admit(pairs[i].ours, "member"));
    guard.established(tickets.back());
  }
  EXPECT_EQ(guard.admit(pairs[3].ours, "one too many"), 0u);
  EXPECT_EQ(guard.counts().num_refused, 1u);
  guard.closed(tickets[0]);
  EXPECT_NE(guard.admit(pairs[4].ours, "after one left"), 0u);
}

TEST(connection_guard, refuse_shuts_one_connection_and_unknown_tickets_are_ignored) {
  connection_guard guard({2, 3, std::chrono::seconds(60)}, "test");
  socket_pair p;
  const uint64_t t = guard.admit(p.ours, "insider");
  guard.established(t);
  guard.refuse(t, "too big", "announced 1 GiB");
  EXPECT_TRUE(p.peer_sees_end());
  guard.closed(t);
  guard.closed(12345);
  guard.established(12345);
  guard.refuse(12345, "x", "x");
  EXPECT_EQ(guard.counts().num_established, 0u);
  EXPECT_EQ(guard.counts().num_pending, 0u);
}

}  // namespace
}  // namespace troupe
