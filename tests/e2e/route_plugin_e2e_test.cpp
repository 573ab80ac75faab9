// The route hook end to end (include/troupe/plugin.h ABI 1.2, issue 28): the tenant-affinity
// example plugin (examples/plugins/tenant_affinity.cpp) in the router of
// - a replicas topology (`troupe serve --config` with two engine nodes): each tenant's requests,
//   sent all at once, land on one instance (the access log's instance=), two tenants on two
//   instances, and the greedy outputs equal a colocated server's without the plugin;
// - a colocated `troupe serve --plugin` (one instance: it is still called, /metrics counts it),
//   behind a misbehaving route plugin whose errors and wrong index fail only their request with
//   a message naming it, while the server serves on.

#include <gtest/gtest.h>

#include <httplib.h>

#include <deque>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

std::string example_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/plugins/libtroupe_" + name + ".so";
}
std::string test_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/tests/plugins/libtest_plugin_" + name + ".so";
}

const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "One day, a bird", "The sun"};

// Greedy requests of `tenant` over ZeroMQ, mixed prompts and lengths, half streamed.
std::vector<mixed_request> tenant_mix(const std::string& tenant, int count, int first) {
  std::vector<mixed_request> mix;
  for (int i = 0; i < count; ++i) {
    mixed_request m;
    m.request.prompt = prompts[static_cast<size_t>(first + i) % prompts.size()];
    m.request.sampling.max_tokens = 12 + (first + i) % 5 * 4;
    m.request.sampling.temperature = 0.0f;
    m.request.stream = i % 2 == 0;
    m.request.targets.tenant = tenant;
    mix.push_back(std::move(m));
  }
  return mix;
}

// The instance of every access line of the log from `from` on.
std::vector<int> instances_in(const std::string& log, size_t from) {
  std::vector<int> out;
  static const std::regex line(R"(request \d+ door=\S+ .* instance=(\d+))");
  const std::string tail = log.substr(std::min(from, log.size()));
  for (auto it = std::sregex_iterator(tail.begin(), tail.end(), line); it != std::sregex_iterator(); ++it) {
    out.push_back(std::stoi((*it)[1].str()));
  }
  return out;
}

TEST(route_plugin_e2e, tenant_affinity_keeps_each_tenant_on_one_instance_of_two_with_colocated_outputs) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  scratch_dir dir;
  make_credentials(dir / "certs", {"controller", "engine-a", "engine-b"});
  // The two tenants: the plugin's rendezvous hash puts "red" on instance 0 and "blue" on 1 (a
  // fixed hash of the name and the instance id, the same on every run).
  const std::vector<mixed_request> red = tenant_mix("red", 8, 0);
  const std::vector<mixed_request> blue = tenant_mix("blue", 8, 3);

  std::vector<outcome> expected_red;
  std::vector<outcome> expected_blue;
  {
    topology_spec colocated;
    controller_process reference(controller_process::kind::serve, colocated.write(dir / "colocated.toml"),
                                 dir / "colocated.log");
    expected_red = run_in_waves(reference, red, red.size());
    expected_blue = run_in_waves(reference, blue, blue.size());
  }

  std::deque<node_process> nodes;
  nodes.emplace_back(dir / "certs", "engine-a", free_port(), dir.path());
  nodes.emplace_back(dir / "certs", "engine-b", free_port(), dir.path());
  topology_spec replicas;
  replicas.credentials = dir / "certs";
  replicas.nodes = {nodes[0].entry(), nodes[1].entry()};
  replicas.engines = {"engine-a", "engine-b"};
  // The route plugin as a [[plugins]] table after the fixture's tables.
  std::ofstream(dir / "replicas.toml") << replicas.toml() << "[[plugins]]\nname = \"affinity\"\nlibrary = \""
                                       << example_plugin("tenant_affinity") << "\"\nhooks = [\"route\"]\n";
  controller_process controller(controller_process::kind::serve, dir / "replicas.toml", dir / "controller.log");

  // Each tenant's requests all at once: the router's own policy would spread them over both.
  auto run_tenant = [&](const std::vector<mixed_request>& mix, const std::vector<outcome>& expected) {
    const size_t log_before = controller.log().size();
    const std::vector<outcome> got = run_in_waves(controller, mix, mix.size());
    for (size_t i = 0; i < mix.size(); ++i) {
      EXPECT_TRUE(same_output(got[i], expected[i])) << "request " << i << ": " << got[i] << " != " << expected[i];
    }
    std::vector<int> where;
    for (int i = 0; i < 100; ++i) {  // the access lines follow the replies: wait for all of them
      where = instances_in(controller.log(), log_before);
      if (where.size() >= mix.size()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(where.size(), mix.size()) << controller.log();
    return std::set<int>(where.begin(), where.end());
  };
  const std::set<int> red_on = run_tenant(red, expected_red);
  const std::set<int> blue_on = run_tenant(blue, expected_blue);
  EXPECT_EQ(red_on, std::set<int>{0}) << controller.log();
  EXPECT_EQ(blue_on, std::set<int>{1}) << controller.log();
}

TEST(route_plugin_e2e, a_colocated_route_plugin_is_called_and_a_misbehaving_one_fails_only_its_request) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::string reference = stories_reference("Once upon a time").at("completion").get<std::string>();
  serve_process server({"--http", "on", "--http-port", "0", "--served-model-name", "stories", "--plugin",
                        test_plugin("misbehaving") + R"(,{"mode": "route_by_tenant"})", "--plugin",
                        example_plugin("tenant_affinity")});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  auto request = [](const std::string& tenant) {
    generate_request r = greedy("Once upon a time", 20);
    r.targets.tenant = tenant;
    return r;
  };
  // The misbehaving plugin has no opinion on these: tenant-affinity places them (one instance).
  for (const char* tenant : {"acme", "acme", "globex"}) {
    const completion out = c.generate(request(tenant));
    EXPECT_EQ(out.text, reference.substr(0, out.text.size())) << tenant;
    EXPECT_EQ(out.usage.completion_tokens, 20);
  }
  const std::pair<const char*, const char*> failures[] = {
      {"error", "plugin 'misbehaving' failed in its route hook: the database is down"},
      {"index_9", "plugin 'misbehaving' returned garbage: it chose candidate 9 of 1"},
  };
  for (const auto& [tenant, expected] : failures) {
    try {
      c.generate(request(tenant));
      ADD_FAILURE() << tenant << ": served";
    } catch (const client_error& e) {
      EXPECT_EQ(e.code(), error_code::internal) << tenant;
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(c.generate(request("acme")).usage.completion_tokens, 20) << "serves on";

  httplib::Client http("127.0.0.1", server.http_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  const std::string& text = res->body;
  // The value of `metric` for the router's `plugin`, as written ("" when absent).
  auto value_of = [&](const std::string& metric, const std::string& plugin) {
    std::istringstream lines(text);
    const std::string labels = "stage=\"router\",plugin=\"" + plugin + "\",hook=\"route\"} ";
    for (std::string line; std::getline(lines, line);) {
      const size_t at = line.find(labels);
      if (line.rfind(metric + "{", 0) == 0 && at != std::string::npos) return line.substr(at + labels.size());
    }
    return std::string();
  };
  // 6 dispatches reached the misbehaving plugin, 2 of them failed; the 4 it had no opinion on
  // reached tenant-affinity.
  EXPECT_EQ(value_of("troupe:plugin_calls_total", "misbehaving"), "6") << text;
  EXPECT_EQ(value_of("troupe:plugin_errors_total", "misbehaving"), "2") << text;
  EXPECT_EQ(value_of("troupe:plugin_calls_total", "tenant-affinity"), "4") << text;
  EXPECT_EQ(value_of("troupe:plugin_errors_total", "tenant-affinity"), "0") << text;
}

}  // namespace
}  // namespace troupe::test::cluster
