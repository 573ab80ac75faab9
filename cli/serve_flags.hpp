#pragma once
// The flags `troupe serve` and `troupe launch` share: every setting of a topology file, given on
// the command line, overrides the file. One definition, so the two commands cannot drift apart.

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "node/topology.hpp"

namespace troupe::cli {

struct serve_flags {
  std::string config;                  // the topology file; --config for serve, the argument for launch
  std::vector<std::string> overrides;  // --set KEY=VALUE on the file's keys (load_topology)
  std::string model;
  std::string load_format;
  std::string zmq_endpoint;
  std::string host = "127.0.0.1";
  int port = 0;
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int max_waiting_requests = 0;
  std::string scheduling_policy;  // "": the topology's
  std::string slo_admission;
  int listen_backlog = 0;
  int zmq_handshake_timeout_ms = 0;
  int64_t zmq_max_pending_handshakes = 0;
  int64_t zmq_max_connections = -1;  // -1: not given (0 is the open-files share)
  int num_kv_blocks = 0;
  int kv_memory_mb = 0;
  int memory_budget_mb = 0;  // 0: not given (the file's, else no bound)
  int max_model_len = 0;
  int threads = -1;
  std::string device;
  float gpu_memory_utilization = 0.0f;
  std::string dtype;
  std::string kv_cache_dtype;
  bool batch_invariant = false;  // float weights' products in one order at every batch size
  int nano_batches = 0;
  std::string async_scheduling;
  int tokenizer_pool_size = 0;
  std::string api_key;
  std::string api_key_file;
  std::string http;  // on | off
  std::string http_host;
  int http_port = -1;
  size_t http_max_body_bytes = 0;
  int http_max_connections = 0;
  int http_request_timeout_ms = 0;
  int64_t http_max_waiting_connections = -1;  // -1: not given
  size_t http_max_header_bytes = 0;
  std::string served_model_name;
  std::vector<std::string> allowed_origins;
  std::string tool_call_parser;
  std::string reasoning_parser;
  int num_speculative_tokens = -1;  // -1: not given (the file's, else 0)
  int max_speculative_tokens = -1;
  std::string draft_model;
  int draft_kv_memory_mb = 0;
  int ngram_min = 0;
  int ngram_max = 0;
  std::string log_level = "info";
  int drain_timeout_s = -1;       // -1: not given (the file's, else 30)
  int log_stats_interval_s = -1;  // -1: not given (the file's, else 10)
  bool no_access_log = false;
  std::string log_format = "text";           // applied while the command line is parsed (every line after)
  std::vector<std::string> pipeline_stages;  // kvtcp://HOST:PORT@FIRST-LAST each, in layer order
  int micro_batches = 0;                     // 0: not given (the file's, else 2)
  int pipeline_failover_wait_ms = -1;        // -1: not given (the file's, else 30000)
  std::vector<std::string> plugins;          // PATH[,CONFIG-JSON] each, after the file's [[plugins]]
};

// Binds every flag but the topology file itself (each command names that its own way).
void add_serve_flags(CLI::App& app, serve_flags& flags);

// The serve flags given to `app` (parsed, bound by add_serve_flags), as a command line that
// gives `troupe serve` the same settings: how `troupe launch` hands its flags to the controller
// it runs as a child. The command's own options (launch's file, --state-dir) are left out.
std::vector<std::string> given_serve_flags(const CLI::App& app);

// The topology file (none: the defaults) with the flags laid over it, validated; throws
// std::runtime_error naming the bad setting.
topology topology_from_flags(const serve_flags& flags);

}  // namespace troupe::cli
