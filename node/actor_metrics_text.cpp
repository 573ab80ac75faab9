#include "node/actor_metrics_text.hpp"

#include <cstdio>
#include <functional>
#include <sstream>

#include "doors/http/metrics_text.hpp"

namespace troupe {

namespace {

std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

// An engine's actors carry its instance id, the one `troupe scale --list`, traces and logs use.
std::string instance_label(int32_t instance) {
  return instance >= 0 ? ",instance=\"" + std::to_string(instance) + "\"" : std::string();
}

void family(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

std::string actor_metrics_text(const cluster_inspection& cluster) {
  std::ostringstream out;
  using actor_value = std::function<double(const actor_stats_snapshot&)>;
  auto actors = [&](const char* name, const char* type, const char* help, const actor_value& value) {
    family(out, name, type, help);
    for (const node_inspection& node : cluster.nodes) {
      for (const actor_row& row : node.actors) {
        out << name << "{node=\"" << escape_label_value(node.node) << "\",stage=\"" << escape_label_value(row.stage)
            << "\",actor=\"" << row.actor_id << '"' << instance_label(row.instance) << "} " << number(value(row.stats))
            << '\n';
      }
    }
  };
  actors("troupe:actor_mailbox_depth", "gauge", "Messages waiting in the actor's mailbox when it last took one.",
         [](const actor_stats_snapshot& s) { return static_cast<double>(s.mailbox_depth); });
  actors("troupe:actor_max_mailbox_depth", "gauge", "The most messages the actor ever saw waiting.",
         [](const actor_stats_snapshot& s) { return static_cast<double>(s.max_mailbox_depth); });
  actors("troupe:actor_messages_total", "counter", "Messages the actor handled.",
         [](const actor_stats_snapshot& s) { return static_cast<double>(s.num_messages); });
  actors("troupe:actor_messages_per_second", "gauge", "Messages the actor handled in the last second.",
         [](const actor_stats_snapshot& s) { return s.messages_per_s; });
  actors("troupe:actor_busy_ratio", "gauge", "Share of the last second the actor spent in its handlers.",
         [](const actor_stats_snapshot& s) { return s.busy_share; });
  actors("troupe:actor_handler_p50_seconds", "gauge", "Median handler time over the last second.",
         [](const actor_stats_snapshot& s) { return s.handler_p50_us / 1e6; });
  actors("troupe:actor_handler_p99_seconds", "gauge", "99th percentile handler time over the last second.",
         [](const actor_stats_snapshot& s) { return s.handler_p99_us / 1e6; });
  actors("troupe:actor_estimated_wait_seconds", "gauge",
         "Mean time a message waited in the mailbox over the last second, by Little's law.",
         [](const actor_stats_snapshot& s) { return s.estimated_wait_ms / 1e3; });

  family(out, "troupe:node_up", "gauge", "1 when the node answered the inspection in time, else 0.");
  for (const node_inspection& node : cluster.nodes) {
    out << "troupe:node_up{node=\"" << escape_label_value(node.node) << "\"} " << (node.reachable ? 1 : 0) << '\n';
  }
  using scheduler_value = std::function<double(const scheduler_row&)>;
  auto schedulers = [&](const char* name, const char* help, const scheduler_value& value) {
    family(out, name, "gauge", help);
    for (const node_inspection& node : cluster.nodes) {
      for (const scheduler_row& row : node.schedulers) {
        if (!row.error.empty()) continue;  // unknown: no sample rather than a made-up one
        out << name << "{node=\"" << escape_label_value(node.node) << "\",actor=\"" << row.actor_id << '"'
            << instance_label(row.instance) << "} " << number(value(row)) << '\n';
      }
    }
  };
  schedulers("troupe:scheduler_kv_cache_usage_perc", "Used share of the scheduler's KV cache blocks (0 to 1).",
             [](const scheduler_row& r) { return r.kv_usage(); });
  schedulers("troupe:scheduler_num_requests_running", "Requests the scheduler runs.",
             [](const scheduler_row& r) { return static_cast<double>(r.num_running); });
  schedulers("troupe:scheduler_num_requests_waiting", "Requests waiting in the scheduler's queue.",
             [](const scheduler_row& r) { return static_cast<double>(r.num_waiting); });
  // Each plugin as a stage of its own: its hook's calls, failures and call times.
  using plugin_value = std::function<double(const plugin_counters&)>;
  auto plugins = [&](const char* name, const char* type, const char* help, const plugin_value& value) {
    family(out, name, type, help);
    for (const node_inspection& node : cluster.nodes) {
      for (const plugin_row& row : node.plugins) {
        out << name << "{node=\"" << escape_label_value(node.node) << "\",stage=\"" << escape_label_value(row.stage)
            << "\",plugin=\"" << escape_label_value(row.counters.plugin) << "\",hook=\""
            << escape_label_value(row.counters.hook) << "\"} " << number(value(row.counters)) << '\n';
      }
    }
  };
  plugins("troupe:plugin_calls_total", "counter", "Calls of the plugin's hook on the stage.",
          [](const plugin_counters& c) { return static_cast<double>(c.num_calls); });
  plugins("troupe:plugin_errors_total", "counter",
          "Calls that failed their request: error returns, exceptions, garbage, calls over budget.",
          [](const plugin_counters& c) { return static_cast<double>(c.num_errors); });
  plugins("troupe:plugin_over_budget_total", "counter",
          "Calls that took longer than the plugin's budget (among the errors).",
          [](const plugin_counters& c) { return static_cast<double>(c.num_over_budget); });
  plugins("troupe:plugin_rejections_total", "counter",
          "Requests the plugin refused (request hook) or stopped (output hook).",
          [](const plugin_counters& c) { return static_cast<double>(c.num_rejected); });
  plugins("troupe:plugin_call_seconds_total", "counter", "Time spent in the plugin's hook.",
          [](const plugin_counters& c) { return c.total_ms / 1e3; });
  plugins("troupe:plugin_call_p50_seconds", "gauge", "Median time of the hook's calls since the stage started.",
          [](const plugin_counters& c) { return c.p50_ms / 1e3; });
  plugins("troupe:plugin_call_p99_seconds", "gauge",
          "99th percentile time of the hook's calls since the stage started.",
          [](const plugin_counters& c) { return c.p99_ms / 1e3; });
  return out.str();
}

}  // namespace troupe
