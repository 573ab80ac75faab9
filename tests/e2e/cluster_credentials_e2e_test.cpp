// Mutual TLS between real processes: a node whose certificate another CA issued gets no stage, a
// controller with another CA's credentials places none on a real node (which keeps serving its
// own controller), and an admin client of another CA gets no answer while the cluster serves on.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "node/admin_door.hpp"
#include "node/cluster_credentials.hpp"
#include "stages/error_category.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_actors.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// What a `troupe scale`-like admin client brings: its certificate and the CA it trusts.
struct admin_client_config : caf::actor_system_config {
  explicit admin_client_config(const member_credentials& files) {
    load<caf::io::middleman>();
    load<caf::openssl::manager>();
    set("logger.console", caf::atom("none"));
    set("openssl.certificate", files.certificate.string());
    set("openssl.key", files.private_key.string());
    set("openssl.cafile", files.ca_certificate.string());
    for_each_message_type(
        [this](auto type, const char* name) { add_message_type<typename decltype(type)::type>(name); });
    register_error_category(*this);
  }
};

// A greedy request the colocated reference and the cluster must answer alike.
outcome one_greedy(const controller_process& server) {
  generate_request r;
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 40;
  return run_over_zmq(server, r, 30s);
}

class cluster_credentials_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(ours(), {"controller", "engine-a", "engine-b", "admin"});
    // Another cluster's CA, with members of the same names.
    make_credentials(theirs(), {"controller", "engine-b", "admin"});
  }

  fs::path ours() const { return dir_ / "ours"; }
  fs::path theirs() const { return dir_ / "theirs"; }

  topology_spec engines_on(const std::vector<node_entry>& nodes) const {
    topology_spec t;
    t.credentials = ours();
    t.nodes = nodes;
    t.engines.clear();
    for (const auto& n : nodes) t.engines.push_back(n.name);
    t.connect_timeout_ms = 3000;  // a refused node costs this much of the test
    return t;
  }

  scratch_dir dir_;
};

// Waits (bounded) for a node's log of a peer it refused in the TLS handshake.
bool refusal_logged(const node_process& node) {
  for (int i = 0; i < 250; ++i) {
    const std::string log = node.log();
    if (log.find("TLS handshake with ") != std::string::npos && log.find(" refused: ") != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(cluster_credentials_e2e, a_node_of_another_ca_gets_no_engine_and_the_controller_names_it) {
  node_process stranger(theirs(), "engine-b", free_port(), dir_.path());
  const fs::path log_path = dir_ / "controller.log";
  child_process controller = failing_controller(engines_on({stranger.entry()}).write(dir_ / "topology.toml"), log_path);
  ASSERT_TRUE(exits_within(controller, 60s)) << "the controller serves with its only engine on a stranger:\n"
                                             << read_file(log_path);
  const std::string log = read_file(log_path);
  EXPECT_TRUE(WIFEXITED(controller.exit_status()) && WEXITSTATUS(controller.exit_status()) != 0) << log;
  EXPECT_NE(log.find("cannot reach node engine-b at 127.0.0.1:" + std::to_string(stranger.port())), std::string::npos)
      << log;
  EXPECT_NE(log.find("the TLS handshake failed"), std::string::npos) << log;
  EXPECT_EQ(log.find("zmq door: listening"), std::string::npos) << log;
  // Both sides log the refusal: the controller rejects the stranger's certificate, and the
  // stranger hears that its CA is unknown.
  EXPECT_NE(log.find("TLS handshake with 127.0.0.1:" + std::to_string(stranger.port()) +
                     " refused: error:0A000086:SSL routines::certificate verify failed"),
            std::string::npos)
      << log;
  EXPECT_TRUE(refusal_logged(stranger)) << stranger.log();
  EXPECT_TRUE(stranger.alive()) << stranger.log();
  EXPECT_EQ(stranger.log().find("stage worker spawned"), std::string::npos) << stranger.log();
}

// A topology naming a node the cluster cannot trust is a wrong topology: the controller does not
// start half of it. The good node outlives that controller and serves the next one.
TEST_F(cluster_credentials_e2e, a_node_of_another_ca_beside_a_good_one_fails_the_start_and_the_good_one_serves_on) {
  node_process good(ours(), "engine-a", free_port(), dir_.path());
  node_process stranger(theirs(), "engine-b", free_port(), dir_.path());
  {
    const fs::path log_path = dir_ / "mixed.log";
    child_process controller =
        failing_controller(engines_on({good.entry(), stranger.entry()}).write(dir_ / "mixed.toml"), log_path);
    ASSERT_TRUE(exits_within(controller, 60s)) << read_file(log_path);
    const std::string log = read_file(log_path);
    EXPECT_NE(log.find("cannot reach node engine-b at 127.0.0.1:" + std::to_string(stranger.port())), std::string::npos)
        << log;
    EXPECT_EQ(stranger.log().find("stage worker spawned"), std::string::npos) << stranger.log();
  }
  topology_spec colocated;
  controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                               dir_ / "colocated.log");
  const outcome expected = one_greedy(reference);
  ASSERT_EQ(expected.error, "");
  ASSERT_TRUE(good.alive()) << good.log();
  controller_process controller(controller_process::kind::serve,
                                engines_on({good.entry()}).write(dir_ / "topology.toml"), dir_ / "controller.log");
  const outcome o = one_greedy(controller);
  EXPECT_TRUE(same_output(o, expected)) << o << " != " << expected << "\n" << controller.log();
  EXPECT_TRUE(stranger.alive());
}

TEST_F(cluster_credentials_e2e, a_controller_of_another_ca_places_nothing_and_the_node_keeps_serving_its_own) {
  node_process node(ours(), "engine-a", free_port(), dir_.path());
  {
    topology_spec wrong = engines_on({node.entry()});
    wrong.credentials = theirs();
    child_process intruder = failing_controller(wrong.write(dir_ / "wrong.toml"), dir_ / "intruder.log");
    ASSERT_TRUE(exits_within(intruder, 60s)) << "a controller of another CA serves on our node:\n"
                                             << read_file(dir_ / "intruder.log");
    const std::string log = read_file(dir_ / "intruder.log");
    EXPECT_NE(log.find("cannot reach node engine-a at 127.0.0.1:" + std::to_string(node.port())), std::string::npos)
        << log;
    EXPECT_TRUE(refusal_logged(node)) << "the node did not log the intruder:\n" << node.log();
    EXPECT_EQ(node.log().find("stage worker spawned"), std::string::npos) << node.log();
  }
  // Missing credentials: the controller refuses to start, naming the files it lacks.
  {
    topology_spec missing = engines_on({node.entry()});
    missing.credentials = dir_ / "nowhere";
    const run_result r = run_troupe("serve --config " + shell_quote(missing.write(dir_ / "missing.toml").string()) +
                                    " --zmq-endpoint 'tcp://127.0.0.1:*' 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find((dir_ / "nowhere").string()), std::string::npos) << r.out;
  }
  ASSERT_TRUE(node.alive()) << node.log();
  topology_spec right = engines_on({node.entry()});
  controller_process controller(controller_process::kind::serve, right.write(dir_ / "right.toml"),
                                dir_ / "controller.log");
  const outcome o = one_greedy(controller);
  EXPECT_EQ(o.error, "") << controller.log();
  EXPECT_EQ(o.completion_tokens, 40);
  EXPECT_NE(node.log().find("stage worker spawned"), std::string::npos) << node.log();
}

TEST_F(cluster_credentials_e2e, an_admin_client_of_another_ca_gets_no_answer_and_the_cluster_serves_on) {
  node_process node(ours(), "engine-a", free_port(), dir_.path());
  topology_spec topology = engines_on({node.entry()});
  topology.admin = true;
  controller_process controller(controller_process::kind::serve, topology.write(dir_ / "topology.toml"),
                                dir_ / "controller.log");
  ASSERT_NE(controller.admin_port(), 0) << controller.log();
  const auto port = static_cast<uint16_t>(controller.admin_port());
  {
    member_credentials stranger = credentials_in(theirs(), "admin");
    // The stranger trusts our CA, so only the controller's check of its certificate can refuse it.
    stranger.ca_certificate = credentials_in(ours(), "admin").ca_certificate;
    admin_client_config config(stranger);
    caf::actor_system system(config);
    auto admin = caf::openssl::remote_actor(system, "127.0.0.1", port);
    EXPECT_FALSE(admin) << "an admin certificate from another CA was accepted";
    EXPECT_TRUE(controller.wait_for_log(
        "refused: error:0A000086:SSL routines::certificate verify failed (accepting side)", 1, 10s))
        << "the controller did not log the refused admin:\n"
        << controller.log();
    if (admin) {
      caf::scoped_actor self(system);
      self->request(*admin, 10s, scale_add_atom::value, std::string("engine-a"))
          .receive([&](std::string& added) { ADD_FAILURE() << "the stranger scaled the cluster: " << added; },
                   [&](caf::error&) {});
    }
  }
  const outcome o = one_greedy(controller);
  EXPECT_EQ(o.error, "") << controller.log();
  EXPECT_EQ(o.completion_tokens, 40);

  // Our own admin client is answered: the door is up, and only the stranger was turned away.
  admin_client_config config(credentials_in(ours(), "admin"));
  caf::actor_system system(config);
  auto admin = caf::openssl::remote_actor(system, "127.0.0.1", port);
  ASSERT_TRUE(admin) << system.render(admin.error()) << "\n" << controller.log();
  caf::scoped_actor self(system);
  std::vector<std::string> lines;
  self->request(*admin, 10s, list_engines_atom::value)
      .receive([&](std::vector<std::string>& answer) { lines = std::move(answer); },
               [&](caf::error& e) { ADD_FAILURE() << "list: " << system.render(e); });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("engine-a active"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace troupe::test::cluster
