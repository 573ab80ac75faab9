// `tools/inspect --once --json` against a real cluster under load: `troupe serve --config` as the
// controller and two `troupe node` processes on 127.0.0.1 (node-a: the tokenizer pool and an
// engine; node-b: an engine and the detokenizer), all with credentials from `troupe certs`.
// Every actor of every node is listed with messages counted; the mailbox depths rise under a
// burst of requests sent at once and drain to 0 after it; and a node killed with SIGKILL shows as
// unreachable within the inspection's bounds instead of hanging it.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/admin_client.hpp"
#include "node/inspection.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

const fs::path inspect_tool = fs::path(TROUPE_SOURCE_DIR) / "tools" / "inspect";

// One `tools/inspect --once --json` run (the script execs this build's binary); the parsed
// snapshot, or a failure that quotes what it printed.
cluster_inspection inspect_once(const fs::path& credentials, int admin_port) {
  const run_result r =
      run_command("TROUPE=" + shell_quote(troupe_binary.string()) + " " + shell_quote(inspect_tool.string()) +
                  " --controller 127.0.0.1:" + std::to_string(admin_port) + " --credentials " +
                  shell_quote(credentials.string()) + " --name watcher --once --json");
  if (r.exit_code != 0) {
    throw std::runtime_error("tools/inspect exited with " + std::to_string(r.exit_code) + ": " + r.err + r.out);
  }
  return cluster_inspection_from_json(nlohmann::json::parse(r.out));
}

const node_inspection* node_named(const cluster_inspection& c, const std::string& name) {
  for (const node_inspection& n : c.nodes) {
    if (n.node == name) return &n;
  }
  return nullptr;
}

std::multiset<std::string> stages_of(const node_inspection& n) {
  std::multiset<std::string> out;
  for (const actor_row& a : n.actors) out.insert(a.stage);
  return out;
}

int64_t total_depth(const cluster_inspection& c) {
  int64_t sum = 0;
  for (const node_inspection& n : c.nodes) {
    for (const actor_row& a : n.actors) sum += a.stats.mailbox_depth;
  }
  return sum;
}

// The largest depth each actor ever saw, by (node, actor id).
std::map<std::pair<std::string, uint64_t>, int64_t> max_depths(const cluster_inspection& c) {
  std::map<std::pair<std::string, uint64_t>, int64_t> out;
  for (const node_inspection& n : c.nodes) {
    for (const actor_row& a : n.actors) out[{n.node, a.actor_id}] = a.stats.max_mailbox_depth;
  }
  return out;
}

TEST(inspect_e2e, lists_every_actor_of_every_node_and_sees_mailboxes_rise_and_drain) {
  scratch_dir dir;
  const fs::path certs = dir / "certs";
  make_credentials(certs, {"controller", "node-a", "node-b", "watcher"});
  node_process a(certs, "node-a", free_port(), dir.path());
  node_process b(certs, "node-b", free_port(), dir.path());
  topology_spec spec;
  spec.credentials = certs;
  spec.nodes = {a.entry(), b.entry()};
  spec.tokenizers = {"node-a"};
  spec.engines = {"node-a", "node-b"};
  spec.detokenizers = {"node-b"};
  spec.admin = true;
  controller_process controller(controller_process::kind::serve, spec.write(dir / "topology.toml"),
                                dir / "controller.log");
  ASSERT_GT(controller.admin_port(), 0) << controller.log();

  // Before any request: every stage is there, on the node the placement names.
  const cluster_inspection before = inspect_once(certs, controller.admin_port());
  ASSERT_EQ(before.nodes.size(), 3u);
  for (const node_inspection& n : before.nodes) EXPECT_TRUE(n.reachable) << n.node << ": " << n.error;
  const std::multiset<std::string> controller_stages{"admin", "cluster-inspector", "frontend", "inspector", "router"};
  const std::multiset<std::string> a_stages{"agent",     "inspector", "kv_agent", "scheduler",
                                            "tokenizer", "tokenizer", "worker"};
  const std::multiset<std::string> b_stages{"agent", "detokenizer", "inspector", "kv_agent", "scheduler", "worker"};
  ASSERT_NE(node_named(before, "controller"), nullptr);
  ASSERT_NE(node_named(before, "node-a"), nullptr);
  ASSERT_NE(node_named(before, "node-b"), nullptr);
  EXPECT_EQ(stages_of(*node_named(before, "controller")), controller_stages);
  EXPECT_EQ(stages_of(*node_named(before, "node-a")), a_stages);
  EXPECT_EQ(stages_of(*node_named(before, "node-b")), b_stages);
  EXPECT_EQ(node_named(before, "node-a")->schedulers.size(), 1u);
  EXPECT_EQ(node_named(before, "node-b")->schedulers.size(), 1u);
  const auto depths_before = max_depths(before);

  // A burst: many long requests at once, from one thread each, while the test samples the
  // cluster as fast as one admin connection answers (bounded in count and time).
  admin_client_options options;
  options.host = "127.0.0.1";
  options.port = static_cast<uint16_t>(controller.admin_port());
  options.credentials_dir = certs;
  options.name = "watcher";
  admin_client watcher(options);
  constexpr int num_requests = 64;
  std::vector<mixed_request> burst;
  for (int i = 0; i < num_requests; ++i) {
    mixed_request m;
    m.request.prompt = "Once upon a time, request " + std::to_string(i);
    m.request.sampling.temperature = 0.0f;
    m.request.sampling.max_tokens = 200;
    m.request.sampling.ignore_eos = true;
    m.request.stream = true;
    burst.push_back(m);
  }
  std::vector<outcome> outcomes(burst.size());
  std::vector<std::thread> senders = send_together(controller, burst, 0, burst.size(), outcomes, 120s);
  int num_samples = 0;
  int num_samples_with_waiting = 0;
  int64_t most_waiting = 0;
  int64_t most_running = 0;
  const auto sampling_ends = std::chrono::steady_clock::now() + 60s;
  for (int i = 0; i < 400 && std::chrono::steady_clock::now() < sampling_ends; ++i) {
    const cluster_inspection now = cluster_inspection_from_json(nlohmann::json::parse(watcher.inspect(5s)));
    ++num_samples;
    const int64_t waiting = total_depth(now);
    most_waiting = std::max(most_waiting, waiting);
    if (waiting > 0) ++num_samples_with_waiting;
    int64_t running = 0;
    for (const node_inspection& n : now.nodes) {
      for (const scheduler_row& s : n.schedulers) running += s.num_running + s.num_waiting;
    }
    most_running = std::max(most_running, running);
    // Enough seen once the burst is under way and has been caught with messages waiting.
    if (num_samples_with_waiting >= 3 && num_samples >= 10) break;
    std::this_thread::sleep_for(20ms);
  }
  for (std::thread& t : senders) t.join();
  for (const outcome& o : outcomes) EXPECT_TRUE(o.error.empty()) << o.error;
  EXPECT_GT(most_running, 0) << "the schedulers never reported a request in " << num_samples << " samples";
  EXPECT_GT(num_samples_with_waiting, 0) << "no sample of " << num_samples << " saw a message waiting";

  // After it: every mailbox drains to 0 (bounded wait), and the depths the burst raised stay as
  // the maxima.
  cluster_inspection after = inspect_once(certs, controller.admin_port());
  for (int i = 0; i < 50 && total_depth(after) != 0; ++i) {
    std::this_thread::sleep_for(100ms);
    after = inspect_once(certs, controller.admin_port());
  }
  ASSERT_EQ(after.nodes.size(), 3u);
  int64_t raised = 0;
  const auto depths_after = max_depths(after);
  for (const node_inspection& n : after.nodes) {
    EXPECT_TRUE(n.reachable) << n.node << ": " << n.error;
    for (const actor_row& actor : n.actors) {
      EXPECT_EQ(actor.stats.mailbox_depth, 0) << n.node << " " << actor.stage << " " << actor.actor_id;
      // Every actor of every node has handled messages: the stages the requests, the
      // inspectors, agents and the admin door the inspections.
      EXPECT_GT(actor.stats.num_messages, 0) << n.node << " " << actor.stage << " " << actor.actor_id;
      const auto was = depths_before.find({n.node, actor.actor_id});
      if (was != depths_before.end()) raised += actor.stats.max_mailbox_depth - was->second;
    }
    for (const scheduler_row& s : n.schedulers) {
      EXPECT_TRUE(s.error.empty()) << s.error;
      EXPECT_EQ(s.num_running, 0);
      EXPECT_EQ(s.num_waiting, 0);
      EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);  // every request's KV freed
    }
  }
  EXPECT_GT(raised, 0) << "the burst raised no actor's largest mailbox depth";
  EXPECT_EQ(stages_of(*node_named(after, "node-a")), a_stages);
  RecordProperty("samples", num_samples);
  RecordProperty("samples_with_waiting", num_samples_with_waiting);
  RecordProperty("most_waiting", static_cast<int>(most_waiting));

  // A node gone without a word: the next inspections answer, listing it unreachable, within the
  // inspection's bounds (1.5 s for an answer, 1 s to connect), never waiting on it.
  b.kill9();
  const auto asked = std::chrono::steady_clock::now();
  const cluster_inspection without_b = inspect_once(certs, controller.admin_port());
  const auto took = std::chrono::steady_clock::now() - asked;
  ASSERT_NE(node_named(without_b, "node-b"), nullptr);
  EXPECT_FALSE(node_named(without_b, "node-b")->reachable);
  EXPECT_FALSE(node_named(without_b, "node-b")->error.empty());
  EXPECT_TRUE(node_named(without_b, "node-a")->reachable) << node_named(without_b, "node-a")->error;
  EXPECT_LT(took, 10s) << "an inspection waited on a dead node";
}

}  // namespace
}  // namespace troupe::test::cluster
