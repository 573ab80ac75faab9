#include "node/pipeline_placement.hpp"

#include <spdlog/spdlog.h>

#include "kvtransfer/kv_channel.hpp"
#include "model/layer_range.hpp"
#include "model/loader/model_part_bytes.hpp"
#include "node/local_host.hpp"

namespace troupe {

namespace {

const char* load_format_flag(load_format format) {
  switch (format) {
    case load_format::safetensors: return "safetensors";
    case load_format::gguf: return "gguf";
    case load_format::dummy: return "dummy";
    case load_format::auto_detect: break;
  }
  return "auto";
}

// The MiB a stage on `node` may hold (its own budget, else [node]'s), 0 for no bound.
int stage_budget_mb(const topology& t, const node_address* node) {
  return node != nullptr && node->memory_budget_mb > 0 ? node->memory_budget_mb : t.model.memory_budget_mb;
}

}  // namespace

void split_pipeline_by_bytes(topology& t) {
  if (t.pipeline_split_nodes.empty()) return;
  if (t.model.format == load_format::dummy) {
    throw std::runtime_error(
        "[pipeline] nodes splits the model by its bytes: a dummy model has no file to weigh; "
        "list the stages with their layers");
  }
  std::vector<const node_address*> nodes;
  for (const std::string& name : t.pipeline_split_nodes) {
    const node_address* node = t.find_node(name);
    if (!node) throw std::runtime_error("[pipeline] nodes: '" + name + "' is not a [[nodes]] name");
    nodes.push_back(node);
  }
  const model_part_bytes parts = read_model_part_bytes(t.model.path);
  const size_t num_stages = nodes.size() + 1;  // and the controller's, last
  auto stage_name = [&](size_t i) { return i < nodes.size() ? nodes[i]->name : std::string("the controller"); };
  // Each stage's room for weights when every stage has a budget (the KV pool takes its share of
  // each, as a stage's load counts it): the split then fills the nodes in proportion.
  const uint64_t kv_mb = t.model.num_kv_blocks == 0 ? static_cast<uint64_t>(t.model.kv_memory_mb) : 0;
  std::vector<double> room_bytes;
  for (size_t i = 0; i < num_stages; ++i) {
    const int budget_mb = stage_budget_mb(t, i < nodes.size() ? nodes[i] : nullptr);
    if (budget_mb <= 0) {
      room_bytes.clear();
      break;
    }
    if (static_cast<uint64_t>(budget_mb) <= kv_mb) {
      throw std::runtime_error("[pipeline] nodes: " + stage_name(i) + "'s memory budget of " +
                               std::to_string(budget_mb) + " MiB leaves nothing beside its KV pool of " +
                               std::to_string(kv_mb) + " MiB");
    }
    room_bytes.push_back(static_cast<double>((static_cast<uint64_t>(budget_mb) - kv_mb) << 20));
  }
  std::vector<layer_range> ranges;
  try {
    ranges = room_bytes.empty()
                 ? split_layers_by_bytes(parts.layers, parts.embedding, parts.head, static_cast<int>(num_stages))
                 : split_layers_by_capacity(parts.layers, parts.embedding, parts.head, room_bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error("[pipeline] nodes: " + std::string(e.what()) + " (" + std::to_string(nodes.size()) +
                             " nodes and the controller)");
  }
  auto mib = [](double bytes) { return fmt::format("{:.1f} MiB", bytes / (1 << 20)); };
  // Refused before anything starts: even the best split leaves a stage past its node's room.
  for (size_t i = 0; i < room_bytes.size(); ++i) {
    const size_t needed = parts.bytes_of(ranges[i]);
    if (static_cast<double>(needed) > room_bytes[i]) {
      throw std::runtime_error("[pipeline] nodes: the model does not fit: layers " + layer_range_text(ranges[i]) +
                               " on " + stage_name(i) + " need " + mib(static_cast<double>(needed)) + " (" +
                               std::to_string(needed) + " bytes) of weights, above the " + mib(room_bytes[i]) +
                               " its memory budget leaves beside the KV pool; add nodes or raise their budgets");
    }
  }
  t.pipeline.stages.clear();
  t.pipeline_stage_nodes.clear();
  for (size_t i = 0; i < num_stages; ++i) {
    const std::string room = room_bytes.empty() ? "" : " of the " + mib(room_bytes[i]) + " it has for them";
    spdlog::info("pipeline: layers {} on {} ({} of weights{})", layer_range_text(ranges[i]), stage_name(i),
                 mib(static_cast<double>(parts.bytes_of(ranges[i]))), room);
    if (i == nodes.size()) break;  // the controller's stage is the engine's own layers
    remote_stage stage;
    stage.endpoint = "kvtcp://" + nodes[i]->host + ":" + std::to_string(nodes[i]->port);
    stage.layers = ranges[i];
    t.pipeline.stages.push_back(std::move(stage));
    t.pipeline_stage_nodes.push_back(nodes[i]->name);
  }
  t.pipeline_split_nodes.clear();
}

void resolve_pipeline_stage_endpoints(topology& t) {
  for_each_placed_stage(t, [&](remote_stage& stage, const std::string& name) {
    if (name.empty()) return;
    const node_address* node = t.find_node(name);
    if (!node) throw std::runtime_error("[pipeline] stage node '" + name + "' is not a [[nodes]] name");
    const std::string address = node->host + ":" + std::to_string(node->port);
    stage.endpoint = t.cluster.credentials.empty()
                         ? "kvtcp://" + address
                         : "curve://" + address + "/" + load_kv_channel_keys(t.cluster.credentials, name).public_key;
  });
}

std::vector<stage_process> local_stage_processes(const topology& t, const std::filesystem::path& troupe_binary,
                                                 const std::string& log_level) {
  std::vector<stage_process> processes;
  for_each_placed_stage(t, [&](const remote_stage& stage, const std::string& name) {
    const node_address* node = t.find_node(name);
    if (!node || !is_local_host(node->host)) return;
    const std::string layers = layer_range_text(stage.layers);
    const model_spec& m = t.model;
    stage_process p;
    p.restart = node->restart;
    p.spec.name = node->name;
    // The stage's KV pool is sized as the engine's: the engine schedules the smallest pool of its
    // stages, and the block size must be the same on both ends.
    p.spec.argv = {troupe_binary.string(),
                   "stage",
                   "--model",
                   m.path,
                   "--load-format",
                   load_format_flag(m.format),
                   "--layers",
                   layers,
                   "--host",
                   node->host,
                   "--port",
                   std::to_string(node->port),
                   "--block-size",
                   std::to_string(m.block_size),
                   "--num-kv-blocks",
                   std::to_string(m.num_kv_blocks),
                   "--kv-memory-mb",
                   std::to_string(m.kv_memory_mb),
                   "--threads",
                   std::to_string(m.backend.threads),
                   "--kv-cache-dtype",
                   node->kv_cache_dtype.empty() ? m.backend.kv_cache_dtype : node->kv_cache_dtype,
                   "--log-level",
                   log_level};
    if (const int budget_mb = stage_budget_mb(t, node); budget_mb > 0) {
      p.spec.argv.insert(p.spec.argv.end(), {"--memory-budget-mb", std::to_string(budget_mb)});
    }
    if (!t.cluster.credentials.empty()) {
      p.spec.argv.insert(p.spec.argv.end(), {"--credentials", t.cluster.credentials.string(), "--name", node->name});
    }
    p.spec.ready_text = "pipeline stage " + layers + " listening on";
    processes.push_back(std::move(p));
  });
  return processes;
}

}  // namespace troupe
