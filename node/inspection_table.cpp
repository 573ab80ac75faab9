#include "node/inspection_table.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <stdexcept>
#include <tuple>

namespace troupe {

namespace {

struct column_info {
  inspect_column column;
  const char* header;
  const char* name;  // for --sort
  char key;
  int width;
};

// The first letter of each header is its key, but for p99 (9): p is p50's.
constexpr column_info columns[] = {
    {inspect_column::node, "NODE", "node", 'n', 12},     {inspect_column::stage, "STAGE", "stage", 's', 17},
    {inspect_column::actor, "ID", "actor", 'i', 5},      {inspect_column::mailbox, "MAILBOX", "mailbox", 'm', 8},
    {inspect_column::max_mailbox, "MAX", "max", 'x', 6}, {inspect_column::rate, "MSG/S", "rate", 'r', 9},
    {inspect_column::busy, "BUSY%", "busy", 'b', 6},     {inspect_column::p50, "P50", "p50", 'p', 10},
    {inspect_column::p99, "P99", "p99", '9', 10},        {inspect_column::messages, "TOTAL", "messages", 't', 10},
};

const column_info& info(inspect_column c) {
  for (const column_info& i : columns) {
    if (i.column == c) return i;
  }
  throw std::logic_error("inspect_column without a description");
}

double number(const actor_row& row, inspect_column c) {
  const actor_stats_snapshot& s = row.stats;
  switch (c) {
    case inspect_column::actor: return static_cast<double>(row.actor_id);
    case inspect_column::mailbox: return static_cast<double>(s.mailbox_depth);
    case inspect_column::max_mailbox: return static_cast<double>(s.max_mailbox_depth);
    case inspect_column::rate: return s.messages_per_s;
    case inspect_column::busy: return s.busy_share;
    case inspect_column::p50: return s.handler_p50_us;
    case inspect_column::p99: return s.handler_p99_us;
    case inspect_column::messages: return static_cast<double>(s.num_messages);
    case inspect_column::node:
    case inspect_column::stage: return 0;
  }
  return 0;
}

// "850ns", "12.3us", "4.56ms", "1.20s": a duration in its own unit, as top does with sizes.
std::string duration_text(double us) {
  char text[32];
  if (us <= 0) return "-";
  if (us < 1) {
    std::snprintf(text, sizeof text, "%.0fns", us * 1000);
  } else if (us < 1000) {
    std::snprintf(text, sizeof text, "%.1fus", us);
  } else if (us < 1e6) {
    std::snprintf(text, sizeof text, "%.2fms", us / 1000);
  } else {
    std::snprintf(text, sizeof text, "%.2fs", us / 1e6);
  }
  return text;
}

std::string pad(std::string text, int width, bool left) {
  if (static_cast<int>(text.size()) >= width) return text.substr(0, static_cast<size_t>(width));
  const std::string space(static_cast<size_t>(width) - text.size(), ' ');
  return left ? text + space : space + text;
}

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string cell(const inspected_actor& a, inspect_column c) {
  const actor_stats_snapshot& s = a.row.stats;
  switch (c) {
    case inspect_column::node: return a.node;
    // An engine's actors by the instance id `troupe scale --list`, traces and logs use.
    case inspect_column::stage:
      return a.row.instance >= 0 ? a.row.stage + " @" + std::to_string(a.row.instance) : a.row.stage;
    case inspect_column::actor: return std::to_string(a.row.actor_id);
    case inspect_column::mailbox: return std::to_string(s.mailbox_depth);
    case inspect_column::max_mailbox: return std::to_string(s.max_mailbox_depth);
    case inspect_column::rate: return fixed(s.messages_per_s, 1);
    case inspect_column::busy: return fixed(s.busy_share * 100, 1);
    case inspect_column::p50: return duration_text(s.handler_p50_us);
    case inspect_column::p99: return duration_text(s.handler_p99_us);
    case inspect_column::messages: return std::to_string(s.num_messages);
  }
  return "";
}

std::string cut(std::string line, size_t width) {
  if (width > 0 && line.size() > width) line.resize(width);
  return line;
}

}  // namespace

const std::vector<inspect_column>& inspect_columns() {
  static const std::vector<inspect_column> all = [] {
    std::vector<inspect_column> out;
    for (const column_info& i : columns) out.push_back(i.column);
    return out;
  }();
  return all;
}

std::optional<inspect_column> column_for_key(char key) {
  for (const column_info& i : columns) {
    if (i.key == key) return i.column;
  }
  return std::nullopt;
}

inspect_column column_named(const std::string& name) {
  std::string choices;
  for (const column_info& i : columns) {
    if (name == i.name) return i.column;
    choices += (choices.empty() ? "" : ", ") + std::string(i.name);
  }
  throw std::invalid_argument("--sort '" + name + "': no such column (one of " + choices + ")");
}

std::vector<inspected_actor> sorted_actors(const cluster_inspection& cluster, inspect_column by) {
  std::vector<inspected_actor> rows;
  for (const node_inspection& node : cluster.nodes) {
    for (const actor_row& row : node.actors) rows.push_back({node.node, row});
  }
  auto identity = [](const inspected_actor& a) { return std::tie(a.node, a.row.stage, a.row.actor_id); };
  std::stable_sort(rows.begin(), rows.end(), [&](const inspected_actor& a, const inspected_actor& b) {
    if (by == inspect_column::node || by == inspect_column::stage) {
      const std::string& x = by == inspect_column::node ? a.node : a.row.stage;
      const std::string& y = by == inspect_column::node ? b.node : b.row.stage;
      if (x != y) return x < y;
    } else if (const double x = number(a.row, by), y = number(b.row, by); x != y) {
      return by == inspect_column::actor ? x < y : x > y;
    }
    return identity(a) < identity(b);
  });
  return rows;
}

std::vector<std::string> render_inspection(const cluster_inspection& cluster, inspect_column by, size_t width,
                                           size_t max_lines) {
  std::vector<std::string> head;
  std::vector<std::string> tail;
  const std::vector<inspected_actor> rows = sorted_actors(cluster, by);

  size_t num_reachable = 0;
  for (const node_inspection& node : cluster.nodes) num_reachable += node.reachable ? 1 : 0;
  const std::time_t taken = static_cast<std::time_t>(cluster.taken_at_unix_ms / 1000);
  char clock[16] = "";
  std::tm local{};
  if (localtime_r(&taken, &local)) std::strftime(clock, sizeof clock, "%H:%M:%S", &local);
  head.push_back(cut(std::string("troupe inspect - ") + clock + " - " + std::to_string(cluster.nodes.size()) +
                         " nodes (" + std::to_string(num_reachable) + " answering), " + std::to_string(rows.size()) +
                         " actors - sorted by " + info(by).name,
                     width));
  head.push_back(
      cut("keys: n s i m x r b p 9 t (or <- ->) sort by that column, q quits; rates, busy and "
          "handler times over the last second",
          width));
  head.emplace_back();
  std::string header;
  for (const column_info& i : columns) {
    const bool left = i.column == inspect_column::node || i.column == inspect_column::stage;
    std::string title = i.header;
    if (i.column == by) title = (left ? "" : "*") + title + (left ? "*" : "");
    header += pad(title, i.width, left) + " ";
  }
  head.push_back(cut(header, width));

  // Schedulers and unanswered nodes below the actors; they are few, so the actors are cut first.
  bool any_scheduler = false;
  for (const node_inspection& node : cluster.nodes) any_scheduler |= !node.schedulers.empty();
  if (any_scheduler) {
    tail.emplace_back();
    tail.push_back(cut(pad("SCHEDULER", 12, true) + " " + pad("ID", 5, false) + " " + pad("KV%", 6, false) + " " +
                           pad("FREE/TOTAL", 13, false) + " " + pad("RUNNING", 8, false) + " " +
                           pad("WAITING", 8, false),
                       width));
    for (const node_inspection& node : cluster.nodes) {
      for (const scheduler_row& s : node.schedulers) {
        std::string line = pad(node.node, 12, true) + " " + pad(std::to_string(s.actor_id), 5, false) + " ";
        if (!s.error.empty()) {
          line += "no answer: " + s.error;
        } else {
          line += pad(fixed(s.kv_usage() * 100, 1), 6, false) + " " +
                  pad(std::to_string(s.num_free_blocks) + "/" + std::to_string(s.num_total_blocks), 13, false) + " " +
                  pad(std::to_string(s.num_running), 8, false) + " " + pad(std::to_string(s.num_waiting), 8, false);
          // A pipeline's stages, each with the share of the last 10 s it computed.
          if (!s.pipeline_busy.empty()) line += "  stages " + s.pipeline_busy;
        }
        tail.push_back(cut(line, width));
      }
    }
  }
  // Plugins, each as a stage of its own: calls, failures and call times since its stage started.
  bool any_plugin = false;
  for (const node_inspection& node : cluster.nodes) any_plugin |= !node.plugins.empty();
  if (any_plugin) {
    tail.emplace_back();
    tail.push_back(cut(pad("PLUGIN", 16, true) + " " + pad("NODE", 12, true) + " " + pad("STAGE", 12, true) + " " +
                           pad("HOOK", 8, true) + " " + pad("CALLS", 10, false) + " " + pad("ERRORS", 7, false) + " " +
                           pad("OVER", 6, false) + " " + pad("REFUSED", 8, false) + " " + pad("P50", 10, false) + " " +
                           pad("P99", 10, false),
                       width));
    for (const node_inspection& node : cluster.nodes) {
      for (const plugin_row& p : node.plugins) {
        const plugin_counters& c = p.counters;
        tail.push_back(cut(
            pad(c.plugin, 16, true) + " " + pad(node.node, 12, true) + " " + pad(p.stage, 12, true) + " " +
                pad(c.hook, 8, true) + " " + pad(std::to_string(c.num_calls), 10, false) + " " +
                pad(std::to_string(c.num_errors), 7, false) + " " + pad(std::to_string(c.num_over_budget), 6, false) +
                " " + pad(std::to_string(c.num_rejected), 8, false) + " " +
                pad(duration_text(c.p50_ms * 1e3), 10, false) + " " + pad(duration_text(c.p99_ms * 1e3), 10, false),
            width));
      }
    }
  }
  for (const node_inspection& node : cluster.nodes) {
    if (!node.reachable) tail.push_back(cut("node " + node.node + " UNREACHABLE: " + node.error, width));
  }

  size_t room = rows.size();
  if (max_lines > 0) {
    const size_t fixed_lines = head.size() + tail.size();
    room = max_lines > fixed_lines ? std::min(rows.size(), max_lines - fixed_lines) : 0;
  }
  std::vector<std::string> lines = std::move(head);
  for (size_t r = 0; r < room; ++r) {
    std::string line;
    for (const column_info& i : columns) {
      const bool left = i.column == inspect_column::node || i.column == inspect_column::stage;
      line += pad(cell(rows[r], i.column), i.width, left) + " ";
    }
    lines.push_back(cut(line, width));
  }
  if (room > 0 && room < rows.size()) {  // the last row says how many are hidden
    lines.back() = cut("... " + std::to_string(rows.size() - room + 1) + " more actors (enlarge the window)", width);
  }
  lines.insert(lines.end(), tail.begin(), tail.end());
  if (max_lines > 0 && lines.size() > max_lines) lines.resize(max_lines);
  return lines;
}

}  // namespace troupe
