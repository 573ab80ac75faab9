#include "node/topology.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "backends/backend_selection.hpp"
#include "text/chat_format.hpp"
#include "protocol/protocol_limits.hpp"

namespace troupe {

namespace {

// Reads the keys of one table, refusing keys it does not know (a typo must not pass silently).
class table_reader {
 public:
  table_reader(const toml::table* table, std::string name, const std::string& source)
      : table_(table), name_(std::move(name)), source_(source) {}

  template <class T>
  void read(const char* key, T& out) {
    const toml::node* node = find(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!node->is_boolean()) bad(key, "true or false");
      out = *node->value<bool>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!node->is_number()) bad(key, "a number");
      const double value = *node->value<double>();
      if (!std::isfinite(value) || std::fabs(value) > double(std::numeric_limits<T>::max()))
        bad(key, "a finite number");
      out = static_cast<T>(value);
    } else if constexpr (std::is_same_v<T, std::string>) {
      auto value = node->value<std::string>();
      if (!node->is_string() || !value) bad(key, "a string");
      out = *value;
    } else if constexpr (std::is_integral_v<T>) {
      if (!node->is_integer()) bad(key, "an integer");
      // Checked against the setting's own type before it is narrowed: 4294967301 must not
      // become 5, nor 2^40 become 0 (issue 25).
      const int64_t value = *node->value<int64_t>();
      const int64_t most = uint64_t(std::numeric_limits<T>::max()) > uint64_t(int64_t(1) << 40)
                               ? int64_t(1) << 40
                               : static_cast<int64_t>(std::numeric_limits<T>::max());
      if (value < 0 || value > most) {
        throw std::runtime_error(source_ + ": [" + name_ + "] " + key + " must be a non-negative integer (at most " +
                                 std::to_string(most) + "), got " + std::to_string(value));
      }
      out = static_cast<T>(value);
    }
  }

  // A string turned into what `parse` makes of it (an enum); parse throws naming the value.
  template <class T, class Parse>
  void read_parsed(const char* key, T& out, Parse parse) {
    std::string text;
    read(key, text);
    if (known_value(key)) {
      try {
        out = parse(text);
      } catch (const std::exception& e) {
        throw std::runtime_error(source_ + ": [" + name_ + "] " + key + ": " + e.what());
      }
    }
  }

  // A switch: true / false, or "on" / "off" / "auto" (auto is on).
  void read_switch(const char* key, bool& out) {
    const toml::node* node = find(key);
    if (!node) return;
    if (node->is_boolean()) {
      out = *node->value<bool>();
      return;
    }
    auto value = node->value<std::string>();
    if (!node->is_string() || !value || (*value != "on" && *value != "off" && *value != "auto")) {
      bad(key, "true, false, \"on\", \"off\" or \"auto\"");
    }
    out = *value != "off";
  }

  void read(const char* key, std::vector<std::string>& out) {
    const toml::node* node = find(key);
    if (!node) return;
    const toml::array* items = node->as_array();
    if (!items) bad(key, "an array of node names");
    out.clear();
    for (const toml::node& item : *items) {
      auto value = item.value<std::string>();
      if (!item.is_string() || !value) bad(key, "an array of node names");
      out.push_back(*value);
    }
  }

  // An array of tables (`key = [{ ... }, ...]`), or null when the key is absent.
  const toml::array* read_tables(const char* key) {
    const toml::node* node = find(key);
    if (!node) return nullptr;
    const toml::array* items = node->as_array();
    if (!items || !items->is_array_of_tables()) bad(key, "an array of tables");
    return items;
  }

  // A key read by other means: not unknown.
  void read_known(const char* key) { known_.insert(key); }

  void finish() const {
    if (!table_) return;
    for (const auto& [key, value] : *table_) {
      if (!known_.count(std::string(key.str()))) {
        throw std::runtime_error(source_ + ": unknown key '" + std::string(key.str()) + "' in [" + name_ + "]");
      }
    }
  }

 private:
  bool known_value(const char* key) const { return table_ && table_->get(key); }

  // The key's value, or null when the table or the key is absent; either way the key is known.
  const toml::node* find(const char* key) {
    known_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }

  [[noreturn]] void bad(const char* key, const char* expected) const {
    throw std::runtime_error(source_ + ": [" + name_ + "] " + key + " must be " + expected);
  }

  const toml::table* table_;
  std::string name_;
  const std::string& source_;
  std::set<std::string> known_;
};

// A kv_cache_dtype setting as written, once parse_kv_cache_dtype accepts it.
std::string checked_kv_cache_dtype(const std::string& text) {
  parse_kv_cache_dtype(text);
  return text;
}

void parse_node_address(const std::string& text, node_address& out, const std::string& where) {
  const size_t colon = text.rfind(':');
  unsigned port = 0;
  const std::string port_text = colon == std::string::npos ? "" : text.substr(colon + 1);
  const auto [end, problem] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (colon == std::string::npos || colon == 0 || port_text.empty() || problem != std::errc() ||
      end != port_text.data() + port_text.size() || port == 0 || port > 65535) {
    throw std::runtime_error(where + ": address '" + text + "' must be HOST:PORT with PORT in 1..65535");
  }
  out.host = text.substr(0, colon);
  out.port = static_cast<uint16_t>(port);
}

// The TOML text as a table; a syntax error names the source and the line.
toml::table parse_toml(std::string_view toml_text, const std::string& source) {
  try {
    return toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream message;
    message << source << ": " << e.description() << " at line " << e.source().begin.line;
    throw std::runtime_error(message.str());
  }
}

}  // namespace

void check_tls_limits(const tls_limits& limits, const std::string& where) {
  const auto& c = limits.connections;
  if (c.handshake_timeout < std::chrono::milliseconds(100) || c.handshake_timeout > std::chrono::minutes(10)) {
    throw std::runtime_error(where + "handshake_timeout_ms must be in 100..600000, got " +
                             std::to_string(c.handshake_timeout.count()));
  }
  if (c.max_pending < 1 || c.max_pending > 65536) {
    throw std::runtime_error(where + "max_pending_handshakes must be in 1..65536, got " +
                             std::to_string(c.max_pending));
  }
  if (c.max_connections < c.max_pending || c.max_connections > 65536) {
    throw std::runtime_error(where + "max_connections must be in max_pending_handshakes (" +
                             std::to_string(c.max_pending) + ")..65536, got " + std::to_string(c.max_connections));
  }
  if (limits.max_message_bytes < (size_t(1) << 20) || limits.max_message_bytes > (size_t(4) << 30)) {
    throw std::runtime_error(where + "max_message_mb must be in 1..4096, got " +
                             std::to_string(limits.max_message_bytes >> 20));
  }
}

model_spec speculative_settings::draft_spec(const model_spec& target) const {
  if (draft_model.empty()) return {};  // no path: no draft model
  model_spec draft = target;
  draft.path = draft_model;
  draft.format = load_format::auto_detect;
  draft.num_kv_blocks = 0;
  draft.kv_memory_mb = draft_kv_memory_mb;
  draft.max_model_len = 0;     // the draft's own; the proposer drafts for no longer history
  draft.backend.layers = {};   // the whole draft, even where the target is a pipeline's last stage
  draft.memory_budget_mb = 0;  // the target's budget is the target's
  return draft;
}

bool topology::colocated() const {
  auto local = [&](const std::vector<std::string>& names) {
    return std::all_of(names.begin(), names.end(), [&](const std::string& n) { return n == cluster.name; });
  };
  return local(placement.tokenizers) && local(placement.engines) && local(placement.detokenizers) &&
         local(placement.prefill) && local(placement.decode);
}

const node_address* topology::find_node(const std::string& name) const {
  for (const node_address& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

void topology::check_door_connection_caps() const {
  if (zmq_max_pending_handshakes < 1 || zmq_max_pending_handshakes > 65536) {
    throw std::runtime_error("[frontend] max_pending_handshakes must be in 1..65536, got " +
                             std::to_string(zmq_max_pending_handshakes));
  }
  if (zmq_max_connections != 0 && (zmq_max_connections < zmq_max_pending_handshakes || zmq_max_connections > 65536)) {
    throw std::runtime_error(
        "[frontend] max_connections must be 0 (a quarter of the open-files limit) or in "
        "max_pending_handshakes (" +
        std::to_string(zmq_max_pending_handshakes) + ")..65536, got " + std::to_string(zmq_max_connections));
  }
  if (http_max_waiting_connections != 0 &&
      (http_max_waiting_connections < 16 || http_max_waiting_connections > 65536)) {
    throw std::runtime_error(
        "[http] max_waiting_connections must be 0 (a quarter of the open-files limit) or in "
        "16..65536, got " +
        std::to_string(http_max_waiting_connections));
  }
}

void topology::validate() const {
  auto positive = [](int value, const char* name) {
    if (value <= 0) throw std::runtime_error(std::string(name) + " must be positive, got " + std::to_string(value));
  };
  model.validate_settings();  // the path may come later, from --model; loading checks it
  if (zmq_endpoint.empty()) throw std::runtime_error("zmq_endpoint is empty");
  const bool pair_pipelined = !prefill_pipeline_stages.empty() || !decode_pipeline_stages.empty();
  if (pair_pipelined && !pipeline.empty()) {
    throw std::runtime_error(
        "[pipeline] gives stages (one colocated engine) and prefill_stages or decode_stages (a prefill/decode "
        "pair): give one or the other");
  }
  if (!pipeline.empty()) {
    pipeline.validate();
    // One driving engine per set of stage servers: a stage serves one link at a time and holds
    // the KV of that engine's blocks.
    if (placement.engines.size() != 1 || !placement.prefill.empty() || !placement.decode.empty()) {
      throw std::runtime_error(
          "[pipeline] drives one engine instance; [placement] places " +
          std::to_string(placement.engines.size() + placement.prefill.size() + placement.decode.size()) +
          " (for a prefill/decode pair of pipelines give prefill_stages and decode_stages; replicas of a pipeline "
          "come later)");
    }
  }
  if (pair_pipelined) {
    if (!placement.engines.empty() || placement.prefill.size() != 1 || placement.decode.size() != 1) {
      throw std::runtime_error(
          "[pipeline] prefill_stages and decode_stages drive one prefill and one decode "
          "instance; [placement] places " +
          std::to_string(placement.prefill.size()) + " prefill, " + std::to_string(placement.decode.size()) +
          " decode and " + std::to_string(placement.engines.size()) + " mixed");
    }
    for (const engine_role role : {engine_role::prefill, engine_role::decode}) {
      try {
        pipeline_for(role).validate();
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string("[pipeline] ") + engine_role_name(role) + "_stages: " + e.what());
      }
    }
  }
  if ((!pipeline.empty() || pair_pipelined) && model.device == device_request::cuda) {
    throw std::runtime_error("[pipeline] stages run on the CPU backend so far; use device = \"cpu\"");
  }
  positive(tokenizer_pool_size, "tokenizer pool_size");
  positive(max_num_batched_tokens, "max_num_batched_tokens");
  positive(max_waiting_requests, "max_waiting_requests");
  if (max_frame_bytes < 1024) throw std::runtime_error("max_frame_bytes must be at least 1024");
  if (listen_backlog < 1 || listen_backlog > 65535) {
    throw std::runtime_error("[frontend] listen_backlog must be in 1..65535, got " + std::to_string(listen_backlog));
  }
  if (zmq_handshake_timeout_ms < 100 || zmq_handshake_timeout_ms > 600000) {
    throw std::runtime_error("[frontend] handshake_timeout_ms must be in 100..600000, got " +
                             std::to_string(zmq_handshake_timeout_ms));
  }
  check_door_connection_caps();
  if (cluster.name.empty()) throw std::runtime_error("[cluster] name is empty");
  std::set<std::string> node_names;
  for (const node_address& n : nodes) {
    if (n.name.empty()) throw std::runtime_error("[[nodes]]: a node without a name");
    if (n.name == cluster.name) throw std::runtime_error("[[nodes]] '" + n.name + "': the controller's own name");
    if (!node_names.insert(n.name).second) throw std::runtime_error("[[nodes]] '" + n.name + "' is listed twice");
  }
  auto check_placement = [&](const std::vector<std::string>& names, const char* key, bool may_be_empty = false) {
    if (names.empty() && !may_be_empty)
      throw std::runtime_error(std::string("[placement] ") + key + " places no instance");
    for (const std::string& name : names) {
      if (name != cluster.name && !node_names.count(name)) {
        throw std::runtime_error(std::string("[placement] ") + key + ": '" + name +
                                 "' is neither a [[nodes]] name nor the controller ('" + cluster.name + "')");
      }
    }
  };
  check_placement(placement.tokenizers, "tokenizers");
  const bool disaggregated = !placement.prefill.empty() || !placement.decode.empty();
  check_placement(placement.engines, "engines", disaggregated);
  check_placement(placement.prefill, "prefill", true);
  check_placement(placement.decode, "decode", true);
  if (!placement.prefill.empty() && placement.decode.empty() && placement.engines.empty()) {
    throw std::runtime_error("[placement] prefill instances need a decode (or mixed engines) instance to hand off to");
  }
  if (disaggregation.kv_transfer_timeout_ms <= 0) {
    throw std::runtime_error("[disaggregation] kv_transfer_timeout_ms must be positive, got " +
                             std::to_string(disaggregation.kv_transfer_timeout_ms));
  }
  if (disaggregation.reservation_wait_ms < 0 ||
      (disaggregation.reservation_wait_ms > 0 &&
       disaggregation.reservation_wait_ms >= disaggregation.kv_transfer_timeout_ms)) {
    throw std::runtime_error("[disaggregation] reservation_wait_ms must be from 1 to below kv_transfer_timeout_ms (" +
                             std::to_string(disaggregation.kv_transfer_timeout_ms) + "), got " +
                             std::to_string(disaggregation.reservation_wait_ms));
  }
  if (disaggregation.controller_kv_host.empty())
    throw std::runtime_error("[disaggregation] controller_kv_host is empty");
  if (disaggregation.transport != kv_transport::zmq) {
    const std::string named =
        "[disaggregation] kv_transport \"" + std::string(kv_transport_name(disaggregation.transport)) + "\"";
    if (const std::string why = kv_transport_unavailable(disaggregation.transport); !why.empty()) {
      throw std::runtime_error(named + " cannot run here: " + why + "; use \"zmq\"");
    }
    // Both are driven by the prefill worker's per-layer stream (kvtransfer/kv_layer_streamer) and the
    // decode worker's receiver; each worker checks again where it starts, on the node that owns
    // its GPU. nccl needs two GPUs (NCCL refuses two ranks on one: "Duplicate GPU detected"):
    // one per host, or two on one; cuda_ipc is for one host.
  }
  check_placement(placement.detokenizers, "detokenizers");
  if (!pipeline_stage_nodes.empty() && pipeline_stage_nodes.size() != pipeline.stages.size()) {
    throw std::runtime_error("[pipeline] names the nodes of " + std::to_string(pipeline_stage_nodes.size()) +
                             " stages for " + std::to_string(pipeline.stages.size()) + " stages");
  }
  if (!pipeline_split_nodes.empty()) {
    if (!pipeline.stages.empty()) {
      throw std::runtime_error(
          "[pipeline] gives both stages and nodes: list the stages with their layers, or the nodes to split the "
          "model over by bytes");
    }
    std::set<std::string> named;
    for (const std::string& name : pipeline_split_nodes) {
      if (!node_names.count(name)) throw std::runtime_error("[pipeline] nodes: '" + name + "' is not a [[nodes]] name");
      if (!named.insert(name).second) throw std::runtime_error("[pipeline] nodes: '" + name + "' is listed twice");
    }
  }
  std::set<std::string> stage_nodes;
  std::vector<std::string> placed_nodes;
  for_each_placed_stage(*this, [&](const remote_stage&, const std::string& node) { placed_nodes.push_back(node); });
  for (const std::string& name : placed_nodes) {
    if (name.empty()) continue;
    if (!node_names.count(name))
      throw std::runtime_error("[pipeline] stage node '" + name + "' is not a [[nodes]] name");
    if (!stage_nodes.insert(name).second) {
      throw std::runtime_error("[pipeline] node '" + name +
                               "' runs two stages: one `troupe stage` per [[nodes]] entry, "
                               "which listens on the node's address");
    }
    using placed_list = std::pair<const std::vector<std::string>*, const char*>;
    const placed_list lists[] = {{&placement.tokenizers, "tokenizers"},
                                 {&placement.engines, "engines"},
                                 {&placement.detokenizers, "detokenizers"},
                                 {&placement.prefill, "prefill"},
                                 {&placement.decode, "decode"}};
    for (const auto& [names, key] : lists) {
      if (std::find(names->begin(), names->end(), name) != names->end()) {
        throw std::runtime_error("[pipeline] node '" + name + "' runs a pipeline stage, so [placement] " + key +
                                 " cannot place there too (a stage node runs `troupe stage` on its address, not "
                                 "`troupe node`)");
      }
    }
  }
  auto at_least = [](int value, int least, const char* name) {
    if (value < least) {
      throw std::runtime_error(std::string("[cluster] ") + name + " must be at least " + std::to_string(least) +
                               ", got " + std::to_string(value));
    }
  };
  at_least(cluster.connect_timeout_ms, 100, "connect_timeout_ms");
  at_least(cluster.request_timeout_ms, 100, "request_timeout_ms");
  at_least(cluster.heartbeat_interval_ms, 10, "heartbeat_interval_ms");
  at_least(cluster.connection_timeout_ms, 2 * std::max(cluster.heartbeat_interval_ms, node_heartbeat_interval_ms),
           "connection_timeout_ms (twice the heartbeat of either side)");
  at_least(cluster.reconnect_interval_ms, 10, "reconnect_interval_ms");
  check_tls_limits(cluster.tls, "[cluster] ");
  if (cluster.max_added_instances > 1024) {
    throw std::runtime_error("[cluster] max_added_instances must be in 0..1024, got " +
                             std::to_string(cluster.max_added_instances));
  }
  if (cluster.failover_wait_ms < 0 || cluster.failover_wait_ms > 3600000) {
    throw std::runtime_error("[cluster] failover_wait_ms must be in 0..3600000, got " +
                             std::to_string(cluster.failover_wait_ms));
  }
  if (cluster.failover_max_waiting < 1 || cluster.failover_max_waiting > 1000000) {
    throw std::runtime_error("[cluster] failover_max_waiting must be in 1..1000000, got " +
                             std::to_string(cluster.failover_max_waiting));
  }
  if ((!colocated() || !cluster.admin_listen.empty()) && cluster.credentials.empty()) {
    throw std::runtime_error(
        "[cluster] credentials is required when stages run on other nodes or an admin door is open "
        "(make them with `troupe certs`)");
  }
  const int max_drafts = protocol_limits{}.max_speculative_tokens;
  if (speculative.max_draft_tokens > max_drafts) {
    throw std::runtime_error("[speculative] max_draft_tokens must be in 0.." + std::to_string(max_drafts) + ", got " +
                             std::to_string(speculative.max_draft_tokens));
  }
  if (speculative.num_draft_tokens > speculative.max_draft_tokens) {
    throw std::runtime_error("[speculative] num_draft_tokens " + std::to_string(speculative.num_draft_tokens) +
                             " exceeds max_draft_tokens " + std::to_string(speculative.max_draft_tokens));
  }
  if (!speculative.draft_model.empty() && speculative.draft_kv_memory_mb <= 0) {
    throw std::runtime_error("[speculative] draft_kv_memory_mb must be positive, got " +
                             std::to_string(speculative.draft_kv_memory_mb));
  }
  if (speculative.ngram.min_n < 1) {
    throw std::runtime_error("[speculative] ngram_min must be at least 1, got " +
                             std::to_string(speculative.ngram.min_n));
  }
  if (speculative.ngram.max_n < speculative.ngram.min_n) {
    throw std::runtime_error("[speculative] ngram_max " + std::to_string(speculative.ngram.max_n) +
                             " is below ngram_min " + std::to_string(speculative.ngram.min_n));
  }
  if (speculative.ngram.max_n >= speculative.ngram.max_lookback) {
    throw std::runtime_error("[speculative] ngram_max must be below " + std::to_string(speculative.ngram.max_lookback) +
                             " (the tokens the lookup searches), got " + std::to_string(speculative.ngram.max_n));
  }
  if (drain_timeout_s < 0 || drain_timeout_s > 3600) {
    throw std::runtime_error("[frontend] drain_timeout_s must be in 0..3600 seconds, got " +
                             std::to_string(drain_timeout_s));
  }
  if (log_stats_interval_s < 0 || log_stats_interval_s > 3600) {
    throw std::runtime_error("[frontend] log_stats_interval_s must be in 0..3600 seconds (0: off), got " +
                             std::to_string(log_stats_interval_s));
  }
  if (http_enabled) {
    if (http_host.empty()) throw std::runtime_error("[http] host is empty");
    if (http_port > 65535)
      throw std::runtime_error("[http] port must be in 0..65535, got " + std::to_string(http_port));
    if (http_max_body_bytes < 1024) throw std::runtime_error("[http] max_body_bytes must be at least 1024");
    if (http_max_connections < 16) {
      throw std::runtime_error("[http] max_connections must be at least 16, got " +
                               std::to_string(http_max_connections));
    }
    if (http_request_timeout_ms < 100) {
      throw std::runtime_error("[http] request_timeout_ms must be at least 100, got " +
                               std::to_string(http_request_timeout_ms));
    }
    if (http_max_header_bytes < 1024) {
      throw std::runtime_error("[http] max_header_bytes must be at least 1024, got " +
                               std::to_string(http_max_header_bytes));
    }
  }
  if (tool_call_parser != "auto" && !parse_tool_call_syntax(tool_call_parser)) {
    throw std::runtime_error("[http] tool_call_parser \"" + tool_call_parser +
                             "\" is not one of auto, llama3_json, hermes, mistral, openai, none");
  }
  if (reasoning_parser != "auto" && !parse_reasoning_syntax(reasoning_parser)) {
    throw std::runtime_error("[http] reasoning_parser \"" + reasoning_parser +
                             "\" is not one of auto, think, harmony, none");
  }
}

namespace {

// The file's keys into a topology, without validate(): the checks come after the caller is done.
topology parse_topology_unvalidated(std::string_view toml_text, const std::string& source) {
  toml::table root = parse_toml(toml_text, source);
  static const std::set<std::string> sections = {"model",          "node",        "frontend", "http",
                                                 "tokenizer",      "scheduler",   "cluster",  "placement",
                                                 "disaggregation", "speculative", "pipeline"};
  for (const auto& [key, value] : root) {
    const bool node_list =
        (key.str() == "nodes" || key.str() == "plugins" || key.str() == "tenants") && value.is_array_of_tables();
    if (!node_list && (!sections.count(std::string(key.str())) || !value.is_table())) {
      throw std::runtime_error(
          source + ": unknown section or top-level key '" + std::string(key.str()) +
          "' (expected [model], [node], [frontend], "
          "[http], [tokenizer], [scheduler], [cluster], [[nodes]], [[plugins]], [[tenants]], [placement], "
          "[disaggregation], [speculative], [pipeline])");
    }
  }
  topology t;
  table_reader model(root["model"].as_table(), "model", source);
  model.read("path", t.model.path);
  model.read_parsed("load_format", t.model.format, parse_load_format);
  model.finish();
  table_reader node(root["node"].as_table(), "node", source);
  node.read_parsed("device", t.model.device, parse_device_request);
  node.read("threads", t.model.backend.threads);
  node.read("gpu_memory_utilization", t.model.backend.gpu_memory_utilization);
  node.read_parsed("dtype", t.model.backend.cuda_dtype, parse_activation_dtype);
  node.read("nano_batches", t.model.backend.nano_batches);
  node.read_parsed("kv_cache_dtype", t.model.backend.kv_cache_dtype, checked_kv_cache_dtype);
  node.read("memory_budget_mb", t.model.memory_budget_mb);
  node.finish();
  table_reader frontend(root["frontend"].as_table(), "frontend", source);
  frontend.read("zmq_endpoint", t.zmq_endpoint);
  frontend.read("api_key", t.api_key);
  frontend.read("max_frame_bytes", t.max_frame_bytes);
  frontend.read("listen_backlog", t.listen_backlog);
  frontend.read("handshake_timeout_ms", t.zmq_handshake_timeout_ms);
  frontend.read("max_pending_handshakes", t.zmq_max_pending_handshakes);
  frontend.read("max_connections", t.zmq_max_connections);
  frontend.read("drain_timeout_s", t.drain_timeout_s);
  frontend.read("access_log", t.access_log);
  frontend.read("log_stats_interval_s", t.log_stats_interval_s);
  frontend.finish();
  table_reader http(root["http"].as_table(), "http", source);
  http.read("enabled", t.http_enabled);
  http.read("host", t.http_host);
  http.read("port", t.http_port);
  http.read("max_body_bytes", t.http_max_body_bytes);
  http.read("max_connections", t.http_max_connections);
  http.read("request_timeout_ms", t.http_request_timeout_ms);
  http.read("max_waiting_connections", t.http_max_waiting_connections);
  http.read("max_header_bytes", t.http_max_header_bytes);
  http.read("served_model_name", t.served_model_name);
  http.read("allowed_origins", t.http_allowed_origins);
  http.read("tool_call_parser", t.tool_call_parser);
  http.read("reasoning_parser", t.reasoning_parser);
  http.finish();
  table_reader tokenizer(root["tokenizer"].as_table(), "tokenizer", source);
  tokenizer.read("pool_size", t.tokenizer_pool_size);
  tokenizer.finish();
  table_reader scheduler(root["scheduler"].as_table(), "scheduler", source);
  scheduler.read("max_num_batched_tokens", t.max_num_batched_tokens);
  scheduler.read("max_num_seqs", t.model.max_num_seqs);
  scheduler.read("max_waiting_requests", t.max_waiting_requests);
  scheduler.read("num_kv_blocks", t.model.num_kv_blocks);
  scheduler.read("kv_memory_mb", t.model.kv_memory_mb);
  scheduler.read("block_size", t.model.block_size);
  scheduler.read("max_model_len", t.model.max_model_len);
  scheduler.read_switch("async_scheduling", t.async_scheduling);
  scheduler.read_parsed("policy", t.scheduling_policy, parse_scheduling_policy);
  scheduler.read_parsed("slo_admission", t.slo_admission, parse_slo_admission);
  scheduler.finish();
  table_reader cluster(root["cluster"].as_table(), "cluster", source);
  std::string credentials;
  cluster.read("credentials", credentials);
  t.cluster.credentials = credentials;
  cluster.read("name", t.cluster.name);
  cluster.read("connect_timeout_ms", t.cluster.connect_timeout_ms);
  cluster.read("request_timeout_ms", t.cluster.request_timeout_ms);
  cluster.read("heartbeat_interval_ms", t.cluster.heartbeat_interval_ms);
  cluster.read("connection_timeout_ms", t.cluster.connection_timeout_ms);
  cluster.read("reconnect_interval_ms", t.cluster.reconnect_interval_ms);
  cluster.read("admin_listen", t.cluster.admin_listen);
  int64_t handshake_timeout_ms = t.cluster.tls.connections.handshake_timeout.count();
  cluster.read("handshake_timeout_ms", handshake_timeout_ms);
  t.cluster.tls.connections.handshake_timeout = std::chrono::milliseconds(handshake_timeout_ms);
  cluster.read("max_pending_handshakes", t.cluster.tls.connections.max_pending);
  cluster.read("max_connections", t.cluster.tls.connections.max_connections);
  size_t max_message_mb = t.cluster.tls.max_message_bytes >> 20;
  cluster.read("max_message_mb", max_message_mb);
  if (max_message_mb < 1 || max_message_mb > 4096) {
    throw std::runtime_error(source + ": [cluster] max_message_mb must be in 1..4096, got " +
                             std::to_string(max_message_mb));
  }
  t.cluster.tls.max_message_bytes = max_message_mb << 20;
  cluster.read("max_added_instances", t.cluster.max_added_instances);
  cluster.read("failover_wait_ms", t.cluster.failover_wait_ms);
  cluster.read("failover_max_waiting", t.cluster.failover_max_waiting);
  cluster.read_parsed("restart", t.cluster.restart, parse_restart_mode);
  cluster.finish();
  // The placement's default names the controller, whatever [cluster] calls it.
  t.placement = stage_placement{{t.cluster.name}, {t.cluster.name}, {t.cluster.name}};
  if (const toml::array* nodes = root["nodes"].as_array()) {
    for (const toml::node& entry : *nodes) {
      table_reader node_entry(entry.as_table(), "[nodes]", source);
      node_address address;
      std::string where;
      node_entry.read("name", address.name);
      node_entry.read("address", where);
      node_entry.read_parsed("kv_cache_dtype", address.kv_cache_dtype, checked_kv_cache_dtype);
      node_entry.read_parsed("restart", address.restart, parse_restart_mode);
      node_entry.read("memory_budget_mb", address.memory_budget_mb);
      node_entry.finish();
      if (address.memory_budget_mb < 0) {
        throw std::runtime_error(source + ": [[nodes]] '" + address.name +
                                 "' memory_budget_mb must be 0 ([node]'s) or positive, got " +
                                 std::to_string(address.memory_budget_mb));
      }
      if (address.name.empty()) throw std::runtime_error(source + ": a [[nodes]] entry has no name");
      parse_node_address(where, address, source + ": [[nodes]] '" + address.name + "'");
      t.nodes.push_back(std::move(address));
    }
  }
  if (const toml::array* plugins = root["plugins"].as_array()) {
    for (const toml::node& entry : *plugins) {
      table_reader plugin_entry(entry.as_table(), "[plugins]", source);
      plugin_spec plugin;
      plugin_entry.read("name", plugin.name);
      plugin_entry.read("library", plugin.library);
      plugin_entry.read("hooks", plugin.hooks);
      plugin_entry.read("budget_ms", plugin.budget_ms);
      // The plugin's own table, handed to it as JSON (its troupe_plugin_init's config_json).
      if (const toml::node* config = entry.as_table()->get("config")) {
        if (!config->is_table()) throw std::runtime_error(source + ": [[plugins]] config must be a table");
        std::ostringstream json;
        json << toml::json_formatter{*config->as_table()};
        plugin.config_json = json.str();
      }
      plugin_entry.read_known("config");
      plugin_entry.finish();
      const std::string who = source + ": [[plugins]] '" + (plugin.name.empty() ? plugin.library : plugin.name) + "'";
      if (plugin.library.empty()) throw std::runtime_error(who + ": no library");
      try {
        validate(plugin);
      } catch (const std::exception& e) {
        throw std::runtime_error(source + ": [[plugins]] " + e.what());
      }
      t.plugins.push_back(std::move(plugin));
    }
  }
  if (const toml::array* tenants = root["tenants"].as_array()) {
    for (const toml::node& entry : *tenants) {
      table_reader tenant_entry(entry.as_table(), "[tenants]", source);
      tenant_settings tenant;
      tenant_entry.read("name", tenant.name);
      tenant_entry.read("api_key", tenant.api_key);
      tenant_entry.read("priority", tenant.priority);
      tenant_entry.read("ttft_ms", tenant.ttft_ms);
      tenant_entry.read("tpot_ms", tenant.tpot_ms);
      tenant_entry.finish();
      t.tenants.push_back(std::move(tenant));
    }
    try {
      tenant_table checked(t.tenants);
    } catch (const std::exception& e) {
      throw std::runtime_error(source + ": [[tenants]]: " + e.what());
    }
  }
  table_reader placement(root["placement"].as_table(), "placement", source);
  placement.read("tokenizers", t.placement.tokenizers);
  placement.read("engines", t.placement.engines);
  placement.read("detokenizers", t.placement.detokenizers);
  placement.read("prefill", t.placement.prefill);
  placement.read("decode", t.placement.decode);
  placement.finish();
  // Naming prefill or decode instances and no mixed ones means none.
  const toml::table* placed = root["placement"].as_table();
  if (placed && !placed->contains("engines") && (placed->contains("prefill") || placed->contains("decode"))) {
    t.placement.engines.clear();
  }
  table_reader disaggregation(root["disaggregation"].as_table(), "disaggregation", source);
  disaggregation.read("kv_transfer_timeout_ms", t.disaggregation.kv_transfer_timeout_ms);
  disaggregation.read("reservation_wait_ms", t.disaggregation.reservation_wait_ms);
  disaggregation.read("controller_kv_host", t.disaggregation.controller_kv_host);
  disaggregation.read_parsed("kv_transport", t.disaggregation.transport, parse_kv_transport);
  disaggregation.finish();
  table_reader speculative(root["speculative"].as_table(), "speculative", source);
  speculative.read("num_draft_tokens", t.speculative.num_draft_tokens);
  speculative.read("max_draft_tokens", t.speculative.max_draft_tokens);
  speculative.read("draft_model", t.speculative.draft_model);
  speculative.read("draft_kv_memory_mb", t.speculative.draft_kv_memory_mb);
  speculative.read("ngram_min", t.speculative.ngram.min_n);
  speculative.read("ngram_max", t.speculative.ngram.max_n);
  speculative.finish();
  table_reader pipeline(root["pipeline"].as_table(), "pipeline", source);
  // `key`'s stages; each may name the [[nodes]] entry launch starts it on (into `nodes`).
  auto read_stages = [&](const char* key, std::vector<std::string>& nodes) {
    const bool with_nodes = std::string_view(key) == "stages";
    std::vector<remote_stage> read;
    const toml::array* stages = pipeline.read_tables(key);
    if (!stages) return read;
    for (const toml::node& entry : *stages) {
      table_reader stage(entry.as_table(), std::string("pipeline.") + key, source);
      remote_stage remote;
      std::string node;
      stage.read("endpoint", remote.endpoint);
      stage.read("node", node);
      stage.read_parsed("layers", remote.layers, [](const std::string& text) {
        return parse_layer_range(text, std::numeric_limits<int>::max());
      });
      stage.finish();
      const std::string which = source + ": [pipeline] " + (with_nodes ? std::string("stage") : std::string(key)) +
                                " " + std::to_string(read.size());
      if (!node.empty() && !remote.endpoint.empty()) {
        throw std::runtime_error(which +
                                 " gives both endpoint and node: give the endpoint of a stage started by hand, "
                                 "or the [[nodes]] entry `troupe launch` starts it on");
      }
      if (node.empty() && remote.endpoint.empty()) {
        throw std::runtime_error(which + " gives neither endpoint nor node");
      }
      if (!node.empty()) {
        const node_address* address = t.find_node(node);
        if (!address) throw std::runtime_error(which + ": node '" + node + "' is not a [[nodes]] name");
        // Plain TCP for now; the cluster's credentials make it curve:// (resolve_pipeline_stage_endpoints).
        remote.endpoint = "kvtcp://" + address->host + ":" + std::to_string(address->port);
      }
      nodes.push_back(std::move(node));
      read.push_back(std::move(remote));
    }
    return read;
  };
  t.pipeline.stages = read_stages("stages", t.pipeline_stage_nodes);
  t.prefill_pipeline_stages = read_stages("prefill_stages", t.prefill_pipeline_stage_nodes);
  t.decode_pipeline_stages = read_stages("decode_stages", t.decode_pipeline_stage_nodes);
  // A list given by endpoints only places nothing.
  for (std::vector<std::string>* nodes :
       {&t.pipeline_stage_nodes, &t.prefill_pipeline_stage_nodes, &t.decode_pipeline_stage_nodes}) {
    if (std::all_of(nodes->begin(), nodes->end(), [](const std::string& n) { return n.empty(); })) nodes->clear();
  }
  pipeline.read("nodes", t.pipeline_split_nodes);
  pipeline.read("micro_batches", t.pipeline.micro_batches);
  pipeline.read("step_timeout_ms", t.pipeline.step_timeout_ms);
  pipeline.read("connect_timeout_ms", t.pipeline.connect_timeout_ms);
  pipeline.read("reconnect_first_delay_ms", t.pipeline.reconnect_first_delay_ms);
  pipeline.read("reconnect_max_delay_ms", t.pipeline.reconnect_max_delay_ms);
  pipeline.read("reconnect_attempts", t.pipeline.reconnect_attempts);
  pipeline.read("failover_wait_ms", t.pipeline.failover_wait_ms);
  pipeline.read("kv_stage_pairs", t.pipeline_kv_stage_pairs);
  pipeline.finish();
  return t;
}

}  // namespace

topology parse_topology(std::string_view toml_text, const std::string& source) {
  topology t = parse_topology_unvalidated(toml_text, source);
  t.validate();
  return t;
}

pipeline_plan topology::pipeline_for(engine_role role) const {
  pipeline_plan plan = pipeline;
  if (role == engine_role::prefill) plan.stages = prefill_pipeline_stages;
  if (role == engine_role::decode) plan.stages = decode_pipeline_stages;
  // Stage k of the prefill sends its layers to stage k of the decode only when the two are cut
  // alike and every stage speaks the same transport (all curve://, holding the cluster's keys, or
  // all plain): a prefill stage without keys cannot reach a decode stage that wants CURVE.
  // Otherwise every layer goes through the engines.
  const auto same_cut = [](const std::vector<remote_stage>& a, const std::vector<remote_stage>& b) {
    const bool curve = !a.empty() && a.front().endpoint.starts_with("curve://");
    const auto alike = [curve](const remote_stage& s) { return s.endpoint.starts_with("curve://") == curve; };
    return !a.empty() && a.size() == b.size() && std::all_of(a.begin(), a.end(), alike) &&
           std::all_of(b.begin(), b.end(), alike) &&
           std::equal(a.begin(), a.end(), b.begin(),
                      [](const remote_stage& x, const remote_stage& y) { return x.layers == y.layers; });
  };
  plan.kv_stage_pairs = pipeline_kv_stage_pairs && role != engine_role::mixed &&
                        same_cut(prefill_pipeline_stages, decode_pipeline_stages);
  return plan;
}

std::string topology::model_name() const {
  if (!served_model_name.empty()) return served_model_name;
  return model_path_as_written.empty() ? model.path : model_path_as_written;
}

std::filesystem::path resolve_against(const std::filesystem::path& base, const std::filesystem::path& relative) {
  if (relative.empty() || relative.is_absolute()) return relative;
  return (base / relative).lexically_normal();
}

void resolve_topology_paths(topology& t, const std::filesystem::path& base) {
  if (t.model_path_as_written.empty()) t.model_path_as_written = t.model.path;
  t.model.path = resolve_against(base, t.model.path).string();
  t.speculative.draft_model = resolve_against(base, t.speculative.draft_model).string();
  t.cluster.credentials = resolve_against(base, t.cluster.credentials);
  // A plugin library named with a directory is a path; a bare file name is left to the dynamic
  // loader's search (LD_LIBRARY_PATH, the system's directories), as dlopen reads it.
  for (plugin_spec& plugin : t.plugins) {
    if (plugin.library.find('/') != std::string::npos) plugin.library = resolve_against(base, plugin.library).string();
  }
}

namespace {

// Sets KEY=VALUE in `root` (see load_topology); throws naming the override when KEY cannot be
// reached (a [[nodes]] entry that does not exist, a key under a value that is not a table).
void apply_override(toml::table& root, const std::string& override_text) {
  const std::string where = "--set " + override_text;
  const size_t equals = override_text.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw std::runtime_error(where + ": expected KEY=VALUE (e.g. http.port=8001)");
  }
  const std::string key = override_text.substr(0, equals);
  const std::string value_text = override_text.substr(equals + 1);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const std::string& part : parts) {
    if (part.empty()) throw std::runtime_error(where + ": the key '" + key + "' has an empty part");
  }
  // The value: TOML when it reads as one, else the text itself.
  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse("v = " + value_text);
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  toml::table* table = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string& part = parts[i];
    toml::node* next = table->get(part);
    if (!next) next = &table->insert_or_assign(part, toml::table{}).first->second;
    if (toml::array* entries = next->as_array()) {
      // An array of tables: the entry by index, or the one whose name is `parts[i + 1]`.
      const std::string& which = parts[++i];
      toml::table* entry = nullptr;
      size_t index = 0;
      const auto [end, error] = std::from_chars(which.data(), which.data() + which.size(), index);
      if (error == std::errc() && end == which.data() + which.size()) {
        if (index < entries->size()) entry = entries->get(index)->as_table();
      } else {
        for (toml::node& e : *entries) {
          toml::table* candidate = e.as_table();
          if (candidate && candidate->get("name") && candidate->get("name")->value<std::string>() == which)
            entry = candidate;
        }
      }
      if (!entry) {
        std::string names;
        for (toml::node& e : *entries) {
          const toml::table* candidate = e.as_table();
          const auto name =
              candidate && candidate->get("name") ? candidate->get("name")->value<std::string>() : std::nullopt;
          names += (names.empty() ? "" : ", ") + name.value_or("?");
        }
        throw std::runtime_error(where + ": no [[" + part + "]] entry '" + which + "' (by name or index 0.." +
                                 std::to_string(entries->size()) + "; there are: " + names + ")");
      }
      if (i + 1 >= parts.size()) throw std::runtime_error(where + ": name a key of the [[" + part + "]] entry");
      table = entry;
      continue;
    }
    table = next->as_table();
    if (!table) throw std::runtime_error(where + ": '" + part + "' is a value, not a section");
  }
  const std::string& last = parts.back();
  if (is_toml) {
    table->insert_or_assign(last, std::move(*parsed.get("v")));
  } else {
    table->insert_or_assign(last, value_text);
  }
}

}  // namespace

topology load_topology(const std::filesystem::path& path) { return load_topology(path, {}); }

topology load_topology(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  topology t = load_topology_unvalidated(path, overrides);
  t.validate();
  return t;
}

topology load_topology_unvalidated(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open topology file " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  std::string source = path.string();
  std::string toml_text = text.str();
  if (!overrides.empty()) {
    toml::table root = parse_toml(toml_text, source);
    for (const std::string& o : overrides) apply_override(root, o);
    std::ostringstream rewritten;
    rewritten << root;
    toml_text = rewritten.str();
    // The parser's errors name the key; this names where the bad value may have come from.
    source += " (with --set";
    for (const std::string& o : overrides) source += " " + o;
    source += ")";
  }
  topology t = parse_topology_unvalidated(toml_text, source);
  // The file's directory made absolute now: the process may change directory later.
  resolve_topology_paths(t, std::filesystem::absolute(path).parent_path());
  return t;
}

}  // namespace troupe
