#include "node/inspection.hpp"

#include <stdexcept>

namespace troupe {

namespace {

template <class T>
T field(const nlohmann::json& j, const char* name, const char* where) {
  if (!j.is_object() || !j.contains(name)) {
    throw std::runtime_error(std::string("inspection JSON: ") + where + " has no field '" + name + "'");
  }
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("inspection JSON: ") + where + "." + name +
                             " has the wrong type: " + e.what());
  }
}

// The engine instance, written only when known and read as -1 when absent (an older node's JSON).
int32_t instance_from_json(const nlohmann::json& j, const char* where) {
  return j.contains("instance") ? field<int32_t>(j, "instance", where) : -1;
}

nlohmann::json to_json(const actor_row& row) {
  const actor_stats_snapshot& s = row.stats;
  nlohmann::json j = {{"stage", row.stage},
                      {"actor_id", row.actor_id},
                      {"num_messages", s.num_messages},
                      {"mailbox_depth", s.mailbox_depth},
                      {"max_mailbox_depth", s.max_mailbox_depth},
                      {"messages_per_s", s.messages_per_s},
                      {"busy_share", s.busy_share},
                      {"handler_p50_us", s.handler_p50_us},
                      {"handler_p99_us", s.handler_p99_us},
                      {"mean_mailbox_depth", s.mean_mailbox_depth},
                      {"estimated_wait_ms", s.estimated_wait_ms},
                      {"since_last_s", s.since_last_s}};
  if (row.instance >= 0) j["instance"] = row.instance;
  return j;
}

actor_row actor_row_from_json(const nlohmann::json& j) {
  constexpr const char* where = "an actor";
  actor_row row;
  row.stage = field<std::string>(j, "stage", where);
  row.actor_id = field<uint64_t>(j, "actor_id", where);
  row.instance = instance_from_json(j, where);
  actor_stats_snapshot& s = row.stats;
  s.num_messages = field<int64_t>(j, "num_messages", where);
  s.mailbox_depth = field<int64_t>(j, "mailbox_depth", where);
  s.max_mailbox_depth = field<int64_t>(j, "max_mailbox_depth", where);
  s.messages_per_s = field<double>(j, "messages_per_s", where);
  s.busy_share = field<double>(j, "busy_share", where);
  s.handler_p50_us = field<double>(j, "handler_p50_us", where);
  s.handler_p99_us = field<double>(j, "handler_p99_us", where);
  s.mean_mailbox_depth = field<double>(j, "mean_mailbox_depth", where);
  s.estimated_wait_ms = field<double>(j, "estimated_wait_ms", where);
  s.since_last_s = field<double>(j, "since_last_s", where);
  return row;
}

nlohmann::json to_json(const scheduler_row& row) {
  nlohmann::json j = {{"actor_id", row.actor_id},
                      {"num_free_blocks", row.num_free_blocks},
                      {"num_total_blocks", row.num_total_blocks},
                      {"kv_usage", row.kv_usage()},
                      {"num_running", row.num_running},
                      {"num_waiting", row.num_waiting},
                      {"error", row.error}};
  if (row.instance >= 0) j["instance"] = row.instance;
  if (!row.pipeline_busy.empty()) j["pipeline_busy"] = row.pipeline_busy;
  return j;
}

scheduler_row scheduler_row_from_json(const nlohmann::json& j) {
  constexpr const char* where = "a scheduler";
  scheduler_row row;
  row.actor_id = field<uint64_t>(j, "actor_id", where);
  row.instance = instance_from_json(j, where);
  row.num_free_blocks = field<int64_t>(j, "num_free_blocks", where);
  row.num_total_blocks = field<int64_t>(j, "num_total_blocks", where);
  row.num_running = field<int64_t>(j, "num_running", where);
  row.num_waiting = field<int64_t>(j, "num_waiting", where);
  row.error = field<std::string>(j, "error", where);
  if (j.contains("pipeline_busy")) row.pipeline_busy = field<std::string>(j, "pipeline_busy", where);
  return row;
}

nlohmann::json to_json(const plugin_row& row) {
  const plugin_counters& c = row.counters;
  return {{"stage", row.stage},
          {"plugin", c.plugin},
          {"hook", c.hook},
          {"num_calls", c.num_calls},
          {"num_errors", c.num_errors},
          {"num_over_budget", c.num_over_budget},
          {"num_rejected", c.num_rejected},
          {"p50_ms", c.p50_ms},
          {"p99_ms", c.p99_ms},
          {"total_ms", c.total_ms}};
}

plugin_row plugin_row_from_json(const nlohmann::json& j) {
  constexpr const char* where = "a plugin";
  plugin_row row;
  row.stage = field<std::string>(j, "stage", where);
  plugin_counters& c = row.counters;
  c.plugin = field<std::string>(j, "plugin", where);
  c.hook = field<std::string>(j, "hook", where);
  c.num_calls = field<int64_t>(j, "num_calls", where);
  c.num_errors = field<int64_t>(j, "num_errors", where);
  c.num_over_budget = field<int64_t>(j, "num_over_budget", where);
  c.num_rejected = field<int64_t>(j, "num_rejected", where);
  c.p50_ms = field<double>(j, "p50_ms", where);
  c.p99_ms = field<double>(j, "p99_ms", where);
  c.total_ms = field<double>(j, "total_ms", where);
  return row;
}

}  // namespace

nlohmann::json to_json(const node_inspection& node) {
  nlohmann::json actors = nlohmann::json::array();
  for (const actor_row& row : node.actors) actors.push_back(to_json(row));
  nlohmann::json schedulers = nlohmann::json::array();
  for (const scheduler_row& row : node.schedulers) schedulers.push_back(to_json(row));
  nlohmann::json plugins = nlohmann::json::array();
  for (const plugin_row& row : node.plugins) plugins.push_back(to_json(row));
  return {{"node", node.node},           {"reachable", node.reachable},         {"error", node.error},
          {"actors", std::move(actors)}, {"schedulers", std::move(schedulers)}, {"plugins", std::move(plugins)}};
}

nlohmann::json to_json(const cluster_inspection& cluster) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const node_inspection& node : cluster.nodes) nodes.push_back(to_json(node));
  return {{"taken_at_unix_ms", cluster.taken_at_unix_ms}, {"nodes", std::move(nodes)}};
}

node_inspection node_inspection_from_json(const nlohmann::json& j) {
  constexpr const char* where = "a node";
  node_inspection node;
  node.node = field<std::string>(j, "node", where);
  node.reachable = field<bool>(j, "reachable", where);
  node.error = field<std::string>(j, "error", where);
  for (const nlohmann::json& row : field<nlohmann::json>(j, "actors", where))
    node.actors.push_back(actor_row_from_json(row));
  for (const nlohmann::json& row : field<nlohmann::json>(j, "schedulers", where)) {
    node.schedulers.push_back(scheduler_row_from_json(row));
  }
  // Optional: a node from before plugins were inspected sends none.
  if (j.contains("plugins")) {
    for (const nlohmann::json& row : field<nlohmann::json>(j, "plugins", where))
      node.plugins.push_back(plugin_row_from_json(row));
  }
  return node;
}

cluster_inspection cluster_inspection_from_json(const nlohmann::json& j) {
  constexpr const char* where = "the inspection";
  cluster_inspection cluster;
  cluster.taken_at_unix_ms = field<int64_t>(j, "taken_at_unix_ms", where);
  for (const nlohmann::json& node : field<nlohmann::json>(j, "nodes", where)) {
    cluster.nodes.push_back(node_inspection_from_json(node));
  }
  return cluster;
}

}  // namespace troupe
