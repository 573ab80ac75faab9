// A local launch's private CA (node/launch_credentials.hpp): when it is made, what it holds, that
// it is reused, and the refusal for a topology with a node on another machine.

#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "node/cluster_credentials.hpp"
#include "node/launch_credentials.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using troupe::testing::scratch_dir;

const char* const two_local_nodes = R"(
[cluster]
admin_listen = "127.0.0.1:0"
[[nodes]]
name = "n1"
address = "127.0.0.1:7001"
[[nodes]]
name = "n2"
address = "localhost:7002"
[placement]
engines = ["n1"]
)";

// As launch reads it: before validate(), which would ask for the credentials.
topology unvalidated(const fs::path& dir, const std::string& text) {
  const fs::path file = dir / "t.toml";
  std::ofstream(file) << text;
  return load_topology_unvalidated(file, {});
}

TEST(launch_credentials, a_topology_that_needs_none_or_names_its_own_gets_none) {
  scratch_dir dir;
  EXPECT_FALSE(local_launch_credentials(unvalidated(dir.path(), ""), dir.path() / "state", "t.toml"))
      << "colocated, no admin door";
  const std::string named =
      "[cluster]\ncredentials = \"certs\"\n[[nodes]]\nname = \"n1\"\naddress = \"127.0.0.1:7001\"\n"
      "[placement]\nengines = [\"n1\"]\n";
  EXPECT_FALSE(local_launch_credentials(unvalidated(dir.path(), named), dir.path() / "state", "t.toml"))
      << "credentials named: the user's own";
  EXPECT_FALSE(fs::exists(dir.path() / "state"));
}

TEST(launch_credentials, every_member_gets_a_certificate_and_kv_keys_once_and_the_topology_then_validates) {
  scratch_dir dir;
  const fs::path state = dir.path() / "state";
  topology t = unvalidated(dir.path(), two_local_nodes);
  const auto made = local_launch_credentials(t, state, "t.toml");
  ASSERT_TRUE(made);
  EXPECT_EQ(made->dir, state / "credentials");
  EXPECT_TRUE(made->made_ca);
  EXPECT_EQ(made->num_issued, 4) << "controller, n1, n2 and admin";
  for (const char* member : {"controller", "n1", "n2", "admin"}) {
    const member_credentials files = credentials_in(made->dir, member);
    EXPECT_NO_THROW(verify_member_credentials(files)) << member;
    EXPECT_TRUE(fs::exists(made->dir / (std::string(member) + ".kv.pub"))) << member;
  }
  EXPECT_EQ(fs::status(state).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(fs::status(made->dir).permissions() & fs::perms::all, fs::perms::owner_all);
  t.cluster.credentials = made->dir;
  EXPECT_NO_THROW(t.validate());

  const auto again = local_launch_credentials(unvalidated(dir.path(), two_local_nodes), state, "t.toml");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->made_ca) << "made once";
  EXPECT_EQ(again->num_issued, 0);
}

TEST(launch_credentials, a_node_on_another_machine_is_refused_naming_it_and_troupe_certs) {
  scratch_dir dir;
  const topology t = unvalidated(dir.path(), R"(
[[nodes]]
name = "here"
address = "127.0.0.1:7001"
[[nodes]]
name = "far"
address = "10.0.0.2:7000"
[placement]
engines = ["here", "far"]
)");
  try {
    local_launch_credentials(t, dir.path() / "state", "t.toml");
    FAIL() << "a remote node was given a private CA";
  } catch (const std::runtime_error& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("t.toml: node far at 10.0.0.2:7000 is not this machine"), std::string::npos) << why;
    EXPECT_NE(why.find("`troupe certs`"), std::string::npos) << why;
  }
  EXPECT_FALSE(fs::exists(dir.path() / "state" / "credentials"));
}

TEST(launch_credentials, the_default_state_dir_is_under_xdg_state_home_and_differs_per_file) {
  scratch_dir dir;
  const char* before = std::getenv("XDG_STATE_HOME");
  const std::optional<std::string> saved = before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("XDG_STATE_HOME", dir.path().c_str(), 1);
  const fs::path a = default_launch_state_dir("/srv/a/replicas.toml");
  const fs::path b = default_launch_state_dir("/srv/b/replicas.toml");
  if (saved) {
    ::setenv("XDG_STATE_HOME", saved->c_str(), 1);
  } else {
    ::unsetenv("XDG_STATE_HOME");
  }
  EXPECT_EQ(a.parent_path(), dir.path() / "troupe" / "launch");
  EXPECT_EQ(a.filename().string().rfind("replicas-", 0), 0u) << a;
  EXPECT_NE(a, b) << "two files of one name do not share a CA";
}

}  // namespace
}  // namespace troupe
