// The inspection's JSON (round trip, refusals naming the field), the live view's table (sorting
// by every column, schedulers, unreachable nodes, the bound on lines) and the Prometheus text of
// the per-actor gauges.

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "node/actor_metrics_text.hpp"
#include "node/inspection.hpp"
#include "node/inspection_table.hpp"

namespace troupe {
namespace {

actor_row row(const std::string& stage, uint64_t id, int64_t depth, double rate, double busy, double p50_us) {
  actor_row r;
  r.stage = stage;
  r.actor_id = id;
  r.stats.num_messages = static_cast<int64_t>(rate * 10);
  r.stats.mailbox_depth = depth;
  r.stats.max_mailbox_depth = depth + 5;
  r.stats.messages_per_s = rate;
  r.stats.busy_share = busy;
  r.stats.handler_p50_us = p50_us;
  r.stats.handler_p99_us = p50_us * 3;
  r.stats.mean_mailbox_depth = static_cast<double>(depth) / 2;
  r.stats.estimated_wait_ms = 1.5;
  r.stats.since_last_s = 0.25;
  return r;
}

cluster_inspection sample() {
  cluster_inspection c;
  c.taken_at_unix_ms = 1'700'000'000'123;
  node_inspection controller;
  controller.node = "controller";
  controller.actors = {row("router", 11, 3, 200, 0.02, 11), row("frontend", 7, 0, 150, 0.01, 8)};
  node_inspection a;
  a.node = "node-a";
  a.actors = {row("worker", 12, 1, 80, 0.6, 1700), row("scheduler", 13, 7, 90, 0.05, 30)};
  scheduler_row s;
  s.actor_id = 13;
  s.num_free_blocks = 1500;
  s.num_total_blocks = 2000;
  s.num_running = 20;
  s.num_waiting = 4;
  s.pipeline_busy = "0-1:41.2%,2-4:38.0%";
  a.schedulers = {s};
  node_inspection b;
  b.node = "node-b";
  b.reachable = false;
  b.error = "no answer within 1500 ms";
  c.nodes = {controller, a, b};
  return c;
}

TEST(inspection, json_round_trips_every_field) {
  const cluster_inspection before = sample();
  const cluster_inspection after = cluster_inspection_from_json(nlohmann::json::parse(to_json(before).dump()));
  ASSERT_EQ(after.nodes.size(), 3u);
  EXPECT_EQ(after.taken_at_unix_ms, before.taken_at_unix_ms);
  EXPECT_EQ(to_json(after), to_json(before));  // every field, through text and back
  const actor_row& worker = after.nodes[1].actors[0];
  EXPECT_EQ(worker.stage, "worker");
  EXPECT_EQ(worker.actor_id, 12u);
  EXPECT_DOUBLE_EQ(worker.stats.busy_share, 0.6);
  EXPECT_EQ(worker.stats.max_mailbox_depth, 6);
  EXPECT_DOUBLE_EQ(worker.stats.since_last_s, 0.25);
  EXPECT_EQ(after.nodes[1].schedulers[0].num_waiting, 4);
  EXPECT_EQ(after.nodes[1].schedulers[0].pipeline_busy, "0-1:41.2%,2-4:38.0%");
  EXPECT_DOUBLE_EQ(after.nodes[1].schedulers[0].kv_usage(), 0.25);
  EXPECT_FALSE(after.nodes[2].reachable);
  EXPECT_EQ(after.nodes[2].error, "no answer within 1500 ms");
  EXPECT_DOUBLE_EQ(to_json(before)["nodes"][1]["schedulers"][0]["kv_usage"].get<double>(), 0.25);
}

// A scheduler of an engine that is not a pipeline (or from a node of before pipelines) has no
// stages: the field is left out, and its absence reads as none.
TEST(inspection, a_scheduler_without_stages_leaves_the_field_out) {
  cluster_inspection c = sample();
  c.nodes[1].schedulers[0].pipeline_busy.clear();
  const nlohmann::json j = to_json(c);
  EXPECT_FALSE(j["nodes"][1]["schedulers"][0].contains("pipeline_busy"));
  EXPECT_EQ(cluster_inspection_from_json(j).nodes[1].schedulers[0].pipeline_busy, "");
}

TEST(inspection, a_missing_or_mistyped_field_is_named) {
  nlohmann::json j = to_json(sample());
  j["nodes"][1]["actors"][0].erase("mailbox_depth");
  try {
    cluster_inspection_from_json(j);
    FAIL() << "accepted an actor without mailbox_depth";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'mailbox_depth'"), std::string::npos) << e.what();
  }
  j = to_json(sample());
  j["nodes"][0]["node"] = 5;
  try {
    cluster_inspection_from_json(j);
    FAIL() << "accepted a number as a node's name";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("node"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cluster_inspection_from_json(nlohmann::json::array()), std::runtime_error);
}

TEST(inspection_table, sorts_by_every_column) {
  const cluster_inspection c = sample();
  auto stages = [&](inspect_column by) {
    std::string out;
    for (const inspected_actor& a : sorted_actors(c, by)) out += a.row.stage + " ";
    return out;
  };
  EXPECT_EQ(stages(inspect_column::busy), "worker scheduler router frontend ");
  EXPECT_EQ(stages(inspect_column::mailbox), "scheduler router worker frontend ");
  EXPECT_EQ(stages(inspect_column::rate), "router frontend scheduler worker ");
  EXPECT_EQ(stages(inspect_column::p50), "worker scheduler router frontend ");
  EXPECT_EQ(stages(inspect_column::p99), "worker scheduler router frontend ");
  EXPECT_EQ(stages(inspect_column::stage), "frontend router scheduler worker ");
  EXPECT_EQ(stages(inspect_column::node), "frontend router scheduler worker ");   // then by stage
  EXPECT_EQ(stages(inspect_column::actor), "frontend router worker scheduler ");  // ids ascending
  EXPECT_EQ(stages(inspect_column::max_mailbox), "scheduler router worker frontend ");
  EXPECT_EQ(stages(inspect_column::messages), "router frontend scheduler worker ");
  // Every column has its key, and the keys differ.
  std::set<inspect_column> seen;
  for (char key : std::string("nsimxrbp9t")) {
    const auto column = column_for_key(key);
    ASSERT_TRUE(column) << key;
    seen.insert(*column);
  }
  EXPECT_EQ(seen.size(), inspect_columns().size());
  EXPECT_FALSE(column_for_key('z'));
}

TEST(inspection_table, a_sort_name_that_is_no_column_is_refused_by_name) {
  EXPECT_EQ(column_named("p99"), inspect_column::p99);
  try {
    column_named("latency");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'latency'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("mailbox"), std::string::npos) << e.what();
  }
}

TEST(inspection_table, shows_actors_schedulers_and_unreachable_nodes_within_the_screen) {
  const cluster_inspection c = sample();
  const std::vector<std::string> lines = render_inspection(c, inspect_column::mailbox, 120);
  std::string all;
  for (const std::string& line : lines) {
    EXPECT_LE(line.size(), 120u) << line;
    all += line + "\n";
  }
  EXPECT_NE(all.find("*MAILBOX"), std::string::npos) << all;  // the sort column is marked
  EXPECT_NE(all.find("3 nodes (2 answering), 4 actors"), std::string::npos) << all;
  // The actor rows in mailbox order: scheduler (7) before router (3).
  EXPECT_LT(all.find("scheduler "), all.find("router "));
  EXPECT_NE(all.find("node-a          13   25.0     1500/2000       20        4  stages 0-1:41.2%,2-4:38.0%"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("node node-b UNREACHABLE: no answer within 1500 ms"), std::string::npos) << all;
  EXPECT_NE(all.find("1.70ms"), std::string::npos) << all;  // the worker's p50 in its unit

  // A short screen: the actor rows give way, the schedulers and the unreachable node stay.
  const std::vector<std::string> short_lines = render_inspection(c, inspect_column::mailbox, 60, 10);
  EXPECT_LE(short_lines.size(), 10u);
  std::string shown;
  for (const std::string& line : short_lines) {
    EXPECT_LE(line.size(), 60u);
    shown += line + "\n";
  }
  EXPECT_NE(shown.find("more actors"), std::string::npos) << shown;
  EXPECT_NE(shown.find("UNREACHABLE"), std::string::npos) << shown;
}

// An engine's scheduler and worker carry the router's instance id (the one `troupe scale --list`,
// traces and logs use): through the JSON, as a Prometheus label, in the live view's stage column.
// Actors of no engine, and JSON from a node that sends none, have none.
TEST(inspection, an_engine_instance_rides_along_in_json_metrics_and_the_table) {
  cluster_inspection c = sample();
  c.nodes[1].actors[0].instance = 3;  // node-a's worker
  c.nodes[1].actors[1].instance = 3;  // and scheduler
  c.nodes[1].schedulers[0].instance = 3;
  const cluster_inspection back = cluster_inspection_from_json(to_json(c));
  EXPECT_EQ(back.nodes[1].actors[0].instance, 3);
  EXPECT_EQ(back.nodes[1].schedulers[0].instance, 3);
  EXPECT_EQ(back.nodes[0].actors[0].instance, -1) << "the router serves no one instance";
  nlohmann::json older = to_json(c.nodes[1]);
  older["actors"][0].erase("instance");
  EXPECT_EQ(node_inspection_from_json(older).actors[0].instance, -1);

  const std::string text = actor_metrics_text(c);
  EXPECT_NE(text.find("troupe:actor_busy_ratio{node=\"node-a\",stage=\"worker\",actor=\"12\",instance=\"3\"} 0.6\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe:scheduler_num_requests_running{node=\"node-a\",actor=\"13\",instance=\"3\"} 20\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe:actor_busy_ratio{node=\"controller\",stage=\"router\",actor=\"11\"} 0.02\n"),
            std::string::npos)
      << text;

  std::string all;
  for (const std::string& line : render_inspection(c, inspect_column::mailbox, 120)) all += line + "\n";
  EXPECT_NE(all.find("scheduler @3"), std::string::npos) << all;
  EXPECT_NE(all.find("worker @3"), std::string::npos) << all;
}

TEST(actor_metrics_text, every_actor_and_scheduler_as_prometheus_text) {
  cluster_inspection c = sample();
  c.nodes[0].actors[0].stage = "odd\"stage\\name";  // label values are escaped
  const std::string text = actor_metrics_text(c);
  EXPECT_NE(text.find("# TYPE troupe:actor_mailbox_depth gauge\n"), std::string::npos);
  EXPECT_NE(text.find("troupe:actor_mailbox_depth{node=\"node-a\",stage=\"scheduler\",actor=\"13\"} 7\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("troupe:actor_messages_total{node=\"controller\",stage=\"odd\\\"stage\\\\name\",actor=\"11\"} 2000\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe:actor_handler_p50_seconds{node=\"node-a\",stage=\"worker\",actor=\"12\"} 0.0017\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe:node_up{node=\"node-b\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:scheduler_kv_cache_usage_perc{node=\"node-a\",actor=\"13\"} 0.25\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe:scheduler_num_requests_waiting{node=\"node-a\",actor=\"13\"} 4\n"), std::string::npos)
      << text;

  // The text format's grammar, line by line: each family's HELP and TYPE before its samples,
  // each sample `name{label="value",...} number`, names unique per family.
  static const std::regex sample_line(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*\} -?[0-9.e+-]+$)");
  static const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter)$)");
  std::istringstream lines(text);
  std::set<std::string> typed;
  int num_samples = 0;
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, type_line)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "family typed twice: " << line;
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, sample_line)) << "not a sample: " << line;
    EXPECT_TRUE(typed.count(m[1])) << "a sample before its TYPE: " << line;
    ++num_samples;
  }
  // 8 actor families of 4 actors, 3 nodes, 3 scheduler families of 1.
  EXPECT_EQ(num_samples, 8 * 4 + 3 + 3 * 1);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

cluster_inspection with_plugins() {
  cluster_inspection c = sample();
  plugin_row logits;
  logits.stage = "worker";
  logits.counters = {"banned_phrases", "logits", 120, 2, 1, 0, 0.004, 0.02, 0.5};
  plugin_row quota;
  quota.stage = "tokenizer";
  quota.counters = {"token-quota", "request", 9, 0, 0, 3, 0.0021, 0.09, 0.04};
  c.nodes[1].plugins = {logits, quota};
  return c;
}

TEST(inspection, plugin_rows_round_trip_and_a_node_from_before_them_has_none) {
  const cluster_inspection before = with_plugins();
  const cluster_inspection after = cluster_inspection_from_json(nlohmann::json::parse(to_json(before).dump()));
  EXPECT_EQ(to_json(after), to_json(before));
  ASSERT_EQ(after.nodes[1].plugins.size(), 2u);
  EXPECT_EQ(after.nodes[1].plugins[0].stage, "worker");
  EXPECT_EQ(after.nodes[1].plugins[0].counters.num_over_budget, 1);
  EXPECT_EQ(after.nodes[1].plugins[1].counters.num_rejected, 3);
  nlohmann::json old = to_json(before);
  old["nodes"][1].erase("plugins");
  EXPECT_TRUE(cluster_inspection_from_json(old).nodes[1].plugins.empty());
  old["nodes"][1]["plugins"] = {{{"stage", "worker"}}};
  try {
    cluster_inspection_from_json(old);
    ADD_FAILURE() << "a plugin row without its fields was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a plugin has no field 'plugin'"), std::string::npos) << e.what();
  }
}

TEST(inspection_table, shows_each_plugin_as_a_stage) {
  std::string all;
  for (const std::string& line : render_inspection(with_plugins(), inspect_column::mailbox, 160)) all += line + "\n";
  EXPECT_NE(all.find("PLUGIN           NODE         STAGE        HOOK"), std::string::npos) << all;
  EXPECT_NE(
      all.find("banned_phrases   node-a       worker       logits          120       2      1        0      4.0us"),
      std::string::npos)
      << all;
  EXPECT_NE(
      all.find("token-quota      node-a       tokenizer    request           9       0      0        3      2.1us"),
      std::string::npos)
      << all;
}

TEST(actor_metrics_text, each_plugin_as_a_stage_with_its_calls_errors_and_times) {
  const std::string text = actor_metrics_text(with_plugins());
  const std::string labels = "{node=\"node-a\",stage=\"worker\",plugin=\"banned_phrases\",hook=\"logits\"} ";
  EXPECT_NE(text.find("# TYPE troupe:plugin_calls_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_calls_total" + labels + "120\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_errors_total" + labels + "2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_over_budget_total" + labels + "1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_call_seconds_total" + labels + "0.0005\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_call_p50_seconds" + labels + "4e-06\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:plugin_rejections_total{node=\"node-a\",stage=\"tokenizer\",plugin=\"token-quota\","
                      "hook=\"request\"} 3\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace troupe
