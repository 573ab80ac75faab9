// accept() at the open-files limit: the waiting connection is accepted with the reserve
// descriptor and closed, so the listen queue drains and poll goes quiet (without the reserve a
// level-triggered poll loop wakes at once, forever: the KV port's 100 % CPU of issue 25).
// The limit is lowered in a child process of its own, never in the test runner.

#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fcntl.h>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "net/bounded_accept.hpp"

namespace troupe {
namespace {

constexpr int num_flood = 20;

int listen_on_loopback(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd, 128) != 0) return -1;
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return fd;
}

// The child: at its open-files limit, drains the flood through accept_connection. Its exit code
// names the first check that failed (0: all passed).
[[noreturn]] void shed_at_the_limit(int listener, int ready_pipe, int go_pipe) {
  reserve_spare_descriptor();
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  if (errno != EMFILE) _exit(10);
  char byte = 1;
  if (::write(ready_pipe, &byte, 1) != 1 || ::read(go_pipe, &byte, 1) != 1) _exit(11);
  int num_shed = 0;
  for (int wakeups = 0; wakeups < 10 * num_flood; ++wakeups) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 200) == 0) break;  // quiet: the queue is empty
    std::string shed;
    const int fd = accept_connection(listener, shed);
    if (fd >= 0) _exit(12);  // there is no descriptor to give it
    if (!shed.empty()) ++num_shed;
  }
  if (num_shed != num_flood) _exit(13);
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, 100) != 0) _exit(14);  // still waking: it would spin
  // Descriptors come back: the next connection is accepted as usual.
  ::close(filler.back());
  ::close(filler[filler.size() - 2]);
  if (::write(ready_pipe, &byte, 1) != 1) _exit(15);
  pollfd q{listener, POLLIN, 0};
  if (::poll(&q, 1, 5000) != 1) _exit(16);
  std::string shed;
  if (accept_connection(listener, shed) < 0 || !shed.empty()) _exit(17);
  _exit(0);
}

TEST(bounded_accept, at_the_open_files_limit_waiting_connections_are_shed_and_the_listener_goes_quiet) {
  uint16_t port = 0;
  const int listener = listen_on_loopback(port);
  ASSERT_GE(listener, 0);
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit limit{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(9);
    shed_at_the_limit(listener, ready[1], go[0]);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  std::vector<int> clients;
  for (int i = 0; i < num_flood; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    clients.push_back(fd);
  }
  ASSERT_EQ(::write(go[1], &byte, 1), 1);
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);  // the flood is drained
  // Each flooding peer was closed (reads the end of the stream), not left in the queue.
  for (int fd : clients) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 2000), 1);
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);
    ::close(fd);
  }
  const int late = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::connect(late, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(late);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (see shed_at_the_limit)";
  for (int fd : {listener, ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

}  // namespace
}  // namespace troupe
