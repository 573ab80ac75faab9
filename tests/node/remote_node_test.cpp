// The remote node's own checks, in process: the --listen address and the credentials it refuses
// to start without. The wire (a controller spawning stages over TLS) is tested end to end in
// tests/e2e/remote_stage_e2e_test.cpp.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "node/cluster_credentials.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "node/remote_node.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(remote_node, parses_a_listen_address) {
  remote_node_options options;
  parse_listen_address("127.0.0.1:4500", options);
  EXPECT_EQ(options.host, "127.0.0.1");
  EXPECT_EQ(options.port, 4500);
  parse_listen_address("node1.cluster:0", options);
  EXPECT_EQ(options.host, "node1.cluster");
  EXPECT_EQ(options.port, 0);
}

TEST(remote_node, a_bad_listen_address_is_named) {
  remote_node_options options;
  for (const std::string bad :
       {"127.0.0.1", ":4500", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:45x", "127.0.0.1:-1"}) {
    SCOPED_TRACE(bad);
    const std::string error = error_of([&] { parse_listen_address(bad, options); });
    EXPECT_NE(error.find("--listen '" + bad + "'"), std::string::npos) << error;
  }
}

TEST(remote_node, does_not_start_without_credentials) {
  remote_node_options options;
  options.host = "127.0.0.1";
  options.name = "node1";
  EXPECT_EQ(error_of([&] { remote_node n(options); }),
            "--credentials is required: nodes authenticate with mutual TLS (troupe certs)");
}

using troupe::testing::scratch_dir;

TEST(remote_node, checks_the_members_credentials_before_it_listens) {
  scratch_dir ours, theirs;
  make_cluster_ca(ours.path(), "ours", 2);
  make_cluster_ca(theirs.path(), "theirs", 2);
  issue_member_certificate(ours.path(), "node1", 1);
  // A member certificate of another CA beside our ca.crt: the check names the mismatch.
  issue_member_certificate(theirs.path(), "node2", 1);
  fs::copy_file(theirs.path() / "node2.crt", ours.path() / "node2.crt");
  fs::copy_file(theirs.path() / "node2.key", ours.path() / "node2.key");

  remote_node_options options;
  options.host = "127.0.0.1";
  options.credentials_dir = ours.path();
  options.name = "node9";
  EXPECT_NE(error_of([&] { remote_node n(options); }).find("node9.crt"), std::string::npos);
  options.name = "node2";
  EXPECT_NE(error_of([&] { remote_node n(options); }).find("node2.crt"), std::string::npos);

  // The KV data plane's keys (troupe certs writes them beside the certificate) are checked too.
  options.name = "node1";
  EXPECT_NE(error_of([&] { remote_node n(options); }).find("node1.kv.key"), std::string::npos);
  write_kv_channel_keys(ours.path(), "node1");
  remote_node n(options);
  EXPECT_GT(n.port(), 0);
  EXPECT_TRUE(n.running_stages().empty());  // empty until a controller places stages
}

}  // namespace
}  // namespace troupe
