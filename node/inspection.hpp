#pragma once
// One look inside a running cluster (`troupe inspect`): every instrumented actor of every node
// with its statistics (stages/actor_stats.hpp), every scheduler's KV usage, running and
// waiting counts, and every stage's plugins with their counters (plugins/plugin_stats.hpp). A node's inspector
// (node/node_inspector.hpp) answers with its node's part, the controller's cluster inspector
// (node/cluster_inspector.hpp) gathers every node's, and the whole travels as JSON: the same text the admin door
// answers, `troupe inspect --once --json` prints and the live view reads. Plain data, no CAF.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plugins/plugin_stats.hpp"
#include "stages/actor_stats.hpp"

namespace troupe {

struct actor_row {
  std::string stage;      // "tokenizer", "router", "scheduler", "worker", "detokenizer", "frontend", ...
  uint64_t actor_id = 0;  // unique within its node
  actor_stats_snapshot stats;
  int32_t instance = -1;  // a scheduler's or worker's engine instance (the router's id); -1: none
};

struct scheduler_row {
  uint64_t actor_id = 0;  // the scheduler's row in `actors`
  int32_t instance = -1;  // its engine instance; -1: not known
  int64_t num_free_blocks = 0;
  int64_t num_total_blocks = 0;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  std::string error;  // non-empty when it did not answer in time: the counts are then unknown
  // A pipelined engine's stages and each one's busy share of the last 10 s ("0-1:41.2%,2-4:38.0%",
  // pipeline/stage_load.hpp); "" when it is not a pipeline (absent from older JSON).
  std::string pipeline_busy;

  double kv_usage() const {
    return num_total_blocks > 0 ? 1.0 - static_cast<double>(num_free_blocks) / static_cast<double>(num_total_blocks)
                                : 0.0;
  }
};

// One plugin on one stage of the node (its counters since the stage started).
struct plugin_row {
  std::string stage;  // "tokenizer" (request hook), "detokenizer" (output), "worker" (logits)
  plugin_counters counters;
};

struct node_inspection {
  std::string node;
  bool reachable = true;  // false: it did not answer in time (then `error` says why)
  std::string error;
  std::vector<actor_row> actors;
  std::vector<scheduler_row> schedulers;
  std::vector<plugin_row> plugins;  // absent from a node's JSON of before plugins: none
};

struct cluster_inspection {
  int64_t taken_at_unix_ms = 0;
  std::vector<node_inspection> nodes;
};

nlohmann::json to_json(const node_inspection& node);
nlohmann::json to_json(const cluster_inspection& cluster);
// Throw std::runtime_error naming the field that is missing or of the wrong type.
node_inspection node_inspection_from_json(const nlohmann::json& j);
cluster_inspection cluster_inspection_from_json(const nlohmann::json& j);

}  // namespace troupe
