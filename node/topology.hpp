#pragma once
// A node's topology: which model, on which device, the stages it runs and their limits.
// Every setting is parsed and checked here, where it is read: enums, not strings, go on.
// Read from a TOML file (config/colocated.toml), then overridden by command-line flags.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ngram_proposer.hpp"
#include "engine/scheduling_policy_kind.hpp"
#include "engine/served_model.hpp"
#include "kvtransfer/kv_transport.hpp"
#include "pipeline/pipelined_model.hpp"
#include "stages/engine_role.hpp"
#include "doors/tenant_table.hpp"
#include "plugins/plugin_spec.hpp"
#include "node/restart_policy.hpp"
#include "node/tls_limits.hpp"

namespace troupe {

// A `troupe node` the topology places stages on ([[nodes]]).
struct node_address {
  std::string name;  // its member name in the cluster's credentials (NAME.crt), unique
  std::string host;  // where it listens: `troupe launch` starts it there, the controller connects
  uint16_t port = 0;
  // The KV cache dtype of the engines placed here; empty: [node] kv_cache_dtype. Prefill and
  // decode sides may differ: the KV plane carries the dtype and the decode side converts.
  std::string kv_cache_dtype;
  // What `troupe launch` does when the node it started here dies (node/restart_policy.hpp).
  restart_mode restart = restart_mode::on_failure;
  // What a pipeline stage here may hold, weights and KV pool, in MiB; 0: [node] memory_budget_mb.
  // A stage refuses to load past it, and [pipeline] nodes splits the model by it.
  int memory_budget_mb = 0;
};

// How often a `troupe node` heartbeats its controllers; a controller's connection_timeout_ms
// must leave room for a few missed ones.
inline constexpr int node_heartbeat_interval_ms = 500;

// [cluster]: how the controller reaches its nodes. Only read when a stage is placed off the
// controller (or an admin door is asked for): a colocated topology needs no credentials.
struct cluster_settings {
  std::filesystem::path credentials;  // from `troupe certs`: ca.crt, NAME.crt, NAME.key
  std::string name = "controller";    // the controller's member name; also its name in placements
  int connect_timeout_ms = 10000;     // connecting to a node and spawning a stage there
  int request_timeout_ms = 30000;     // any other request that crosses nodes (stats, pings)
  int heartbeat_interval_ms = 500;    // CAF middleman heartbeats on every node connection
  int connection_timeout_ms = 3000;   // a connection silent this long is dead (a cut network)
  int reconnect_interval_ms = 500;    // a lost engine's node is tried again this often
  std::string admin_listen;           // HOST:PORT for `troupe scale`; empty: no admin door
  // The bounds of the controller's TLS ports (the admin door) and of its connections' handshakes
  // (node/tls_middleman.hpp): handshake_timeout_ms, max_pending_handshakes, max_connections,
  // max_message_mb.
  tls_limits tls;
  // Engine instances `troupe scale --add` may add beyond the topology's own; each holds a model
  // and a KV pool on its node.
  int max_added_instances = 16;
  // While no engine instance takes requests (the last one was lost), requests wait this long for
  // one to come back (launch restarting its node, the keeper placing it again) before failing
  // with `unavailable`; 0 fails them at once. At most failover_max_waiting wait; more are refused
  // at once. Only where an instance can come back: some engine on another node, or an admin door.
  int failover_wait_ms = 30000;
  int failover_max_waiting = 1024;
  // What `troupe launch` does when the controller it started dies (as a node's restart).
  restart_mode restart = restart_mode::on_failure;
};

// [placement]: which node runs each stage. Every entry names a [[nodes]] entry or the
// controller (cluster.name); an entry more is an instance more.
struct stage_placement {
  std::vector<std::string> tokenizers{"controller"};    // a pool of [tokenizer] pool_size each
  std::vector<std::string> engines{"controller"};       // a scheduler and its worker each (mixed)
  std::vector<std::string> detokenizers{"controller"};  // requests spread by id
  // Disaggregation: engine instances that only prefill, and ones that only decode (docs/
  // design/cluster.md, "Prefill/decode disaggregation"). A [placement] naming either and not
  // `engines` places no mixed instance.
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
};

// [disaggregation]: the KV data plane between prefill and decode instances.
struct disaggregation_settings {
  // A transfer not complete by then (from the decode side's reservation) is given up on both
  // sides and the request runs again; also bounds how long a prefill side holds its frames.
  int kv_transfer_timeout_ms = 10000;
  // A decode instance whose oldest request has waited this long for its KV blocks takes no new
  // pair, and with none left new requests are refused as `overloaded` (stages/engine_router.hpp,
  // "Pair admission"). 0 (unset): a third of kv_transfer_timeout_ms. Set: below it, or the bound is
  // useless (the transfers would expire first).
  int reservation_wait_ms = 0;
  int reservation_wait_bound_ms() const {
    return reservation_wait_ms > 0 ? reservation_wait_ms : std::max(1, kv_transfer_timeout_ms / 3);
  }
  // Where the controller's own engine instances receive KV (a node's bind on its [[nodes]] host).
  std::string controller_kv_host = "127.0.0.1";
  // kv_transport: "zmq" (default), "cuda_ipc" or "nccl" (kvtransfer/kv_transport.hpp). A GPU
  // transport is refused at startup where it cannot run (a build without CUDA, no GPU), here
  // and again by each worker on its own node. "nccl" is for two GPUs (two hosts, or two GPUs of
  // one), "cuda_ipc" for one host (NCCL refuses two ranks on one GPU).
  kv_transport transport = kv_transport::zmq;
};

// [speculative]: speculative decoding (docs/design/engine.md, "Speculative decoding"). Every
// worker proposes drafts, from its draft model when one is named, else by n-gram prompt lookup;
// the target model verifies them, so outputs are the same either way.
struct speculative_settings {
  int num_draft_tokens = 0;     // drafts per step for a request that does not choose; 0: off
  int max_draft_tokens = 16;    // the most a request may ask for (protocol_limits::max_speculative_tokens)
  std::string draft_model;      // HF directory, .gguf or config.json of the target's vocabulary; empty: n-gram
  int draft_kv_memory_mb = 64;  // the draft's own KV pool (CPU; on CUDA it takes its share of the GPU)
  ngram_settings ngram;         // ngram_min, ngram_max

  // The draft's model_spec: `target`'s device, backend and limits, its own path and KV budget.
  model_spec draft_spec(const model_spec& target) const;
};

struct topology {
  // [model] path, load_format; [node] device, threads, gpu_memory_utilization, dtype, nano_batches,
  // kv_cache_dtype;
  // [scheduler] num_kv_blocks, kv_memory_mb, block_size, max_model_len, max_num_seqs.
  model_spec model;
  // [frontend]
  std::string zmq_endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: no key is asked for
  // [[tenants]] name, api_key, priority, ttft_ms, tpot_ms: per-tenant keys and the defaults of
  // their requests (doors/tenant_table.hpp).
  std::vector<tenant_settings> tenants;
  size_t max_frame_bytes = 4u << 20;
  // TCP connections the kernel queues for the door: a burst of clients beyond it waits a second
  // for SYN retries. Well above max_num_seqs; Linux caps it at net.core.somaxconn.
  int listen_backlog = 4096;
  int zmq_handshake_timeout_ms = 5000;  // [frontend] handshake_timeout_ms: a ZeroMQ client's greeting
  // [frontend] max_pending_handshakes, max_connections: the ZeroMQ door's relay (zmq_door_options);
  // max_connections 0: a quarter of the open-files limit's descriptors, three per connection.
  size_t zmq_max_pending_handshakes = 64;
  size_t zmq_max_connections = 0;
  // [frontend] drain_timeout_s: on SIGTERM, running requests may go on this long (new ones are
  // refused at once), then the rest end with an error; 0..3600 (docs/reliability.md).
  int drain_timeout_s = 30;
  // [frontend] access_log: one line per finished request; log_stats_interval_s: the throughput
  // line every so many seconds when something happened (0: off), 0..3600.
  bool access_log = true;
  int log_stats_interval_s = 10;
  // [http]: the OpenAI-compatible API (docs/http_api.md), guarded by the same api_key.
  bool http_enabled = false;  // config/colocated.toml turns it on; so does --http-port
  std::string http_host = "127.0.0.1";
  int http_port = 8000;  // 0: any free port (logged)
  size_t http_max_body_bytes = 4u << 20;
  int http_max_connections = 256;       // connections served at once; each open stream holds one
  int http_request_timeout_ms = 10000;  // a request's line, headers and body all in by then, else 408
  // [http] max_waiting_connections: connections waiting for a request at once (the one waiting
  // longest closed for a newer one); 0: a quarter of the open-files limit, 16..4096.
  size_t http_max_waiting_connections = 0;
  size_t http_max_header_bytes = 64u << 10;  // a request line and headers larger: 431
  std::string served_model_name;             // the `model` requests name; empty: model_name()'s default
  // [model] path as the topology file wrote it, before it was resolved against the file's
  // directory: the served name's default stays what the user wrote. Empty: model.path as given.
  std::string model_path_as_written;
  // How the model writes tool calls and reasoning (text/chat_format.hpp): "auto" reads it from
  // the chat template; else a family by vLLM's name (llama3_json, hermes, mistral, openai, none;
  // think, harmony, none).
  // Origins a browser page may call the API from (CORS): "*" for any; empty: none.
  std::vector<std::string> http_allowed_origins;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
  // [tokenizer]
  int tokenizer_pool_size = 2;
  // [[plugins]] and `troupe serve --plugin`, in order: their request hooks run in the tokenizers,
  // their output hooks in the detokenizers, their logits hooks in the workers and their route
  // hooks in the controller's router (include/troupe/plugin.h).
  std::vector<plugin_spec> plugins;
  // [scheduler] (and model.max_num_seqs, model.num_kv_blocks, ...)
  int max_num_batched_tokens = 2048;
  int max_waiting_requests = 4096;
  // How each instance's scheduler orders its queues (engine/scheduling_policy.hpp): fcfs,
  // priority (the default), slo or fair; with slo, slo_admission "reject" refuses at once a
  // request whose TTFT target cannot be met, "best_effort" serves it late.
  scheduling_policy_kind scheduling_policy = scheduling_policy_kind::priority;
  slo_admission_mode slo_admission = slo_admission_mode::best_effort;
  // Plan step N+1 while the worker runs step N (docs/design/engine.md, "Overlapped scheduling").
  // Read from true | false | "on" | "off" | "auto"; auto is on for both backends (measured in
  // docs/benchmarks.md: on the CPU too it halves the runtime's cost per step).
  bool async_scheduling = true;
  // [cluster], [[nodes]], [placement]: where the stages run (all on the controller by default).
  cluster_settings cluster;
  std::vector<node_address> nodes;
  stage_placement placement;
  disaggregation_settings disaggregation;
  speculative_settings speculative;
  // [pipeline]: the model's earlier layers on `troupe stage` servers, the engine holding the
  // rest (issue 27): stages = [{ endpoint = "kvtcp://HOST:PORT", layers = "0-15" }, ...],
  // micro_batches, step_timeout_ms, connect_timeout_ms, reconnect_first_delay_ms,
  // reconnect_max_delay_ms, reconnect_attempts, failover_wait_ms. One engine instance, on the
  // CPU, so far.
  pipeline_plan pipeline;
  // The [[nodes]] entry that runs each remote stage, index for index with pipeline.stages, for
  // stages written { node = NAME, layers = "0-15" } ("" for one written with its endpoint):
  // `troupe launch` starts a `troupe stage` there, listening on the node's address, and the
  // endpoint is that address (node/pipeline_placement.hpp). Such a node runs nothing else.
  std::vector<std::string> pipeline_stage_nodes;
  // [pipeline] nodes = ["a", "b"]: the model cut by bytes into one stage per node, in order, and
  // the controller's engine holding the last (node/pipeline_placement.hpp, split_pipeline_by_bytes
  // turns them into stages and empties this). Either this or stages.
  std::vector<std::string> pipeline_split_nodes;
  // [pipeline] prefill_stages / decode_stages: a prefill/decode pair whose instances are each a
  // pipeline ({ endpoint = ..., layers = ... } as in stages, started with `troupe stage`; or
  // { node = ..., layers = ... }, started by `troupe launch` like a placed stage). Each
  // instance's stage servers serve it alone, so the pair is one prefill and one decode instance.
  // The other [pipeline] settings apply to both. The prefill streams its KV layer by layer after
  // each forward, its stages' layers fetched over their links; the decode imports each layer
  // into the stage that holds it.
  std::vector<remote_stage> prefill_pipeline_stages;
  std::vector<remote_stage> decode_pipeline_stages;
  // The [[nodes]] entry of each of those stages, as pipeline_stage_nodes ("" for an endpoint).
  std::vector<std::string> prefill_pipeline_stage_nodes;
  std::vector<std::string> decode_pipeline_stage_nodes;

  // [pipeline] kv_stage_pairs: such a pair cut at the same layers moves each stage's KV between
  // the matching stages (kvtransfer/kv_stage_pairs.hpp); false: through the engines.
  bool pipeline_kv_stage_pairs = true;
  // The pipeline of an engine instance in `role`: [pipeline] stages for a mixed instance,
  // prefill_stages or decode_stages for the pair's.
  pipeline_plan pipeline_for(engine_role role) const;

  // The name the HTTP API serves the model as: served_model_name, else the model path as written.
  std::string model_name() const;
  // True when every stage runs in the controller's process.
  bool colocated() const;
  // The [[nodes]] entry named `name`, or null (the controller, or no such node).
  const node_address* find_node(const std::string& name) const;

  // Throws std::runtime_error naming the bad setting.
  void validate() const;
  // The client doors' connection caps ([frontend], [http]) in range; part of validate().
  void check_door_connection_caps() const;
};

// Calls fn(stage, node) for every stage of [pipeline] stages, prefill_stages and decode_stages
// placed on a [[nodes]] entry (node empty: one given by its endpoint): what `troupe launch`
// places (node/pipeline_placement.hpp). `Topology` is topology or const topology.
template <class Topology, class Fn>
void for_each_placed_stage(Topology& t, Fn&& fn) {
  const auto visit = [&](auto& stages, const auto& nodes) {
    for (size_t i = 0; i < nodes.size() && i < stages.size(); ++i) fn(stages[i], nodes[i]);
  };
  visit(t.pipeline.stages, t.pipeline_stage_nodes);
  visit(t.prefill_pipeline_stages, t.prefill_pipeline_stage_nodes);
  visit(t.decode_pipeline_stages, t.decode_pipeline_stage_nodes);
}

// Throws std::runtime_error naming the bad bound, each prefixed with `where` (e.g. "[cluster] ").
void check_tls_limits(const tls_limits& limits, const std::string& where);

// `source` names the text in error messages (the file's path).
topology parse_topology(std::string_view toml_text, const std::string& source = "topology");
// Reads the file at `path`; every relative path in it ([model] path, [speculative] draft_model,
// [cluster] credentials) is resolved against the file's own directory, so a topology means the
// same from any working directory. Absolute paths are kept.
topology load_topology(const std::filesystem::path& path);
// The same with `overrides` applied to the file's keys first, each "KEY=VALUE" (`--set`): KEY a
// dotted path (`http.port`, `scheduler.max_num_seqs`), a [[nodes]] entry addressed by its name
// or index (`nodes.engine-a.address`, `nodes.0.restart`); VALUE read as a TOML value (`8001`,
// `true`, `["n1"]`, `"text"`), else taken as a string. A key the topology does not know, or a
// value of the wrong type, fails like one in the file, naming the key and the override.
topology load_topology(const std::filesystem::path& path, const std::vector<std::string>& overrides);
// The same without validate(), for a caller that fills in what it provides first (`troupe
// launch`: a local launch's private credentials) and then loads the file for real.
topology load_topology_unvalidated(const std::filesystem::path& path, const std::vector<std::string>& overrides);

// `relative` resolved against `base` (a directory); an absolute or empty path unchanged.
std::filesystem::path resolve_against(const std::filesystem::path& base, const std::filesystem::path& relative);
// Every path-like key of `t` resolved against `base` (what load_topology does with the file's
// directory).
void resolve_topology_paths(topology& t, const std::filesystem::path& base);

}  // namespace troupe
