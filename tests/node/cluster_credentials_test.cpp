// The cluster's credentials: a private CA, members' certificates, the checks that refuse what the
// CA did not issue, and mutual TLS through CAF's OpenSSL module with those very files.

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <gtest/gtest.h>

#include "node/cluster_credentials.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

using troupe::testing::scratch_dir;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(cluster_credentials, a_member_issued_by_the_ca_is_accepted) {
  scratch_dir dir;
  make_cluster_ca(dir.path(), "test", 2);
  const member_credentials node = issue_member_certificate(dir.path(), "node1", 1);
  EXPECT_NO_THROW(verify_member_credentials(node));
  EXPECT_EQ(certificate_common_name(node.certificate), "node1");
  EXPECT_EQ(certificate_common_name(dir.path() / "ca.crt"), "test CA");
  // Private keys are readable by their owner only.
  struct stat info {};
  ASSERT_EQ(stat(node.private_key.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((dir.path() / "ca.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

TEST(cluster_credentials, a_certificate_from_another_ca_is_refused_by_name) {
  scratch_dir ours, theirs;
  make_cluster_ca(ours.path(), "ours", 2);
  make_cluster_ca(theirs.path(), "theirs", 2);
  member_credentials stranger = issue_member_certificate(theirs.path(), "node1", 1);
  stranger.ca_certificate = ours.path() / "ca.crt";
  const std::string error = error_of([&] { verify_member_credentials(stranger); });
  EXPECT_NE(error.find("is not accepted by"), std::string::npos) << error;
}

TEST(cluster_credentials, a_key_that_is_not_the_certificates_is_refused) {
  scratch_dir dir;
  make_cluster_ca(dir.path(), "test", 2);
  member_credentials a = issue_member_certificate(dir.path(), "a", 1);
  const member_credentials b = issue_member_certificate(dir.path(), "b", 1);
  a.private_key = b.private_key;
  const std::string error = error_of([&] { verify_member_credentials(a); });
  EXPECT_NE(error.find("does not belong to"), std::string::npos) << error;
}

TEST(cluster_credentials, nothing_is_overwritten_and_bad_names_are_refused) {
  scratch_dir dir;
  make_cluster_ca(dir.path(), "test", 2);
  EXPECT_NE(error_of([&] { make_cluster_ca(dir.path(), "test", 2); }).find("already holds a CA"), std::string::npos);
  issue_member_certificate(dir.path(), "node1", 1);
  EXPECT_NE(error_of([&] { issue_member_certificate(dir.path(), "node1", 1); }).find("already exists"),
            std::string::npos);
  EXPECT_NO_THROW(issue_member_certificate(dir.path(), "node1", 1, true));
  EXPECT_NE(error_of([&] { issue_member_certificate(dir.path(), "../x", 1); }).find("only letters"), std::string::npos);
  EXPECT_NE(error_of([&] { issue_member_certificate(dir.path(), "", 1); }).find("1 to 64"), std::string::npos);
  EXPECT_NE(error_of([&] { issue_member_certificate(dir.path(), "ca", 1); }).find("certificate authority"),
            std::string::npos);
  EXPECT_NE(error_of([&] { issue_member_certificate(dir.path(), "n", 0); }).find("1 to 36500 days"), std::string::npos);
  scratch_dir empty;
  EXPECT_NE(error_of([&] { issue_member_certificate(empty.path(), "n", 1); }).find("no CA key"), std::string::npos);
}

// -- mutual TLS through CAF with these files -------------------------------------------------------

struct tls_config : caf::actor_system_config {
  explicit tls_config(const member_credentials& files) {
    load<caf::io::middleman>();
    load<caf::openssl::manager>();
    set("logger.console", caf::atom("none"));
    set("openssl.certificate", files.certificate.string());
    set("openssl.key", files.private_key.string());
    set("openssl.cafile", files.ca_certificate.string());
  }
};

caf::behavior echo(caf::event_based_actor*) {
  return {[](int32_t x) { return x + 1; }};
}

TEST(cluster_credentials, caf_connects_members_of_one_ca_and_refuses_a_stranger) {
  scratch_dir ours, theirs;
  make_cluster_ca(ours.path(), "ours", 2);
  make_cluster_ca(theirs.path(), "theirs", 2);
  const member_credentials node = issue_member_certificate(ours.path(), "node", 1);
  const member_credentials controller = issue_member_certificate(ours.path(), "controller", 1);
  member_credentials stranger = issue_member_certificate(theirs.path(), "intruder", 1);
  // The stranger trusts our CA, so only the node's check of the stranger's certificate can refuse it.
  stranger.ca_certificate = ours.path() / "ca.crt";

  tls_config node_config(node);
  caf::actor_system node_system(node_config);
  auto published = node_system.spawn(echo);
  auto port = caf::openssl::publish(published, 0, "127.0.0.1");
  ASSERT_TRUE(port) << node_system.render(port.error());

  {
    tls_config config(controller);
    caf::actor_system system(config);
    auto remote = caf::openssl::remote_actor(system, "127.0.0.1", *port);
    ASSERT_TRUE(remote) << system.render(remote.error());
    caf::scoped_actor self(system);
    int32_t answer = 0;
    self->request(*remote, std::chrono::seconds(10), int32_t{41})
        .receive([&](int32_t x) { answer = x; }, [&](caf::error& e) { ADD_FAILURE() << system.render(e); });
    EXPECT_EQ(answer, 42);
  }
  {
    tls_config config(stranger);
    caf::actor_system system(config);
    auto remote = caf::openssl::remote_actor(system, "127.0.0.1", *port);
    EXPECT_FALSE(remote) << "a certificate from another CA was accepted";
  }
  caf::anon_send_exit(published, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
