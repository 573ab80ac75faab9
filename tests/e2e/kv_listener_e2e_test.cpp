// A server that never disaggregates opens no KV listener (issue 25: colocated `troupe serve`
// listened on 127.0.0.1 for KV frames, and a local peer dripping one held its SIGTERM shutdown).
// Its listening sockets, read from /proc, are its doors' and nothing else.

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/e2e_support.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

// The TCP ports `pid` listens on: its socket inodes (/proc/PID/fd) in LISTEN state (/proc/net/tcp*).
std::set<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    for (dirent* e; (e = ::readdir(d)) != nullptr;) {
      char target[128] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      const std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(read_file(table));
    std::string line;
    std::getline(lines, line);
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

TEST(kv_listener, colocated_serving_listens_only_on_its_doors) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  serve_process server({"--http-port", "0"});
  // A request first: the engine has run, so anything it would open is open.
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  generate_request request;
  request.prompt = "Once upon a time";
  request.sampling.max_tokens = 4;
  EXPECT_EQ(c.generate(request).token_ids.size(), 4u);
  const int zmq_port = std::stoi(server.endpoint().substr(server.endpoint().rfind(':') + 1));
  EXPECT_EQ(listening_ports(server.pid()), (std::set<int>{zmq_port, server.http_port()}))
      << "a port besides the ZeroMQ door's and the HTTP door's";
}

}  // namespace
}  // namespace troupe::test
