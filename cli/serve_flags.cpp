#include "cli/serve_flags.hpp"

#include "doors/operator_log.hpp"
#include "engine/scheduling_policy_kind.hpp"
#include "node/pipeline_placement.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace troupe::cli {
namespace {

// The key file's content without surrounding whitespace (a trailing newline is usual); an empty
// key would silently turn authentication off, so it is refused.
std::string read_api_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("--api-key-file: cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  const auto first = key.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw std::runtime_error("--api-key-file: " + path + " holds no key");
  key = key.substr(first, key.find_last_not_of(" \t\r\n") - first + 1);
  if (key.size() > 1024) throw std::runtime_error("--api-key-file: the key in " + path + " is longer than 1024 bytes");
  return key;
}

}  // namespace

void add_serve_flags(CLI::App& app, serve_flags& flags) {
  app.add_option("--model", flags.model, "HF model directory or .gguf file");
  app.add_option("--load-format", flags.load_format, "auto | safetensors | gguf | dummy");
  app.add_option("--zmq-endpoint", flags.zmq_endpoint, "ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:5557");
  app.add_option("--host", flags.host, "host for --port");
  app.add_option("--port", flags.port, "TCP port (binds tcp://HOST:PORT)");
  app.add_option("--listen-backlog", flags.listen_backlog,
                 "TCP connections queued for the ZeroMQ door (capped by net.core.somaxconn)")
      ->check(CLI::Range(1, 65535));
  // The door caps are checked in their own 64-bit type here, and in range by the topology's
  // validation once they are in it (the same error as the file's keys).
  app.add_option("--zmq-handshake-timeout-ms", flags.zmq_handshake_timeout_ms,
                 "a ZeroMQ client must finish its handshake within this (100 to 600000; default 5000)")
      ->check(CLI::Range(100, 600000));
  app.add_option(
         "--zmq-max-pending-handshakes", flags.zmq_max_pending_handshakes,
         "ZeroMQ connections in their handshake at once, the oldest closed for a newer one (1 to 65536; default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_option("--zmq-max-connections", flags.zmq_max_connections,
                 "ZeroMQ connections open at once (0: a quarter of the open-files limit, three descriptors each; "
                 "else at least --zmq-max-pending-handshakes, at most 65536)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  app.add_option("--max-num-seqs", flags.max_num_seqs, "sequences running at once");
  app.add_option("--max-num-batched-tokens", flags.max_num_batched_tokens, "token budget of one step");
  app.add_option("--max-waiting-requests", flags.max_waiting_requests, "queue bound; beyond it: overloaded");
  app.add_option("--scheduling-policy", flags.scheduling_policy,
                 "how waiting requests are ordered: fcfs | priority (default) | slo | fair")
      ->check(CLI::IsMember({"fcfs", "priority", "slo", "fair"}));
  app.add_option(
         "--slo-admission", flags.slo_admission,
         "slo policy: reject (refuse at once a request whose TTFT target cannot be met) | best_effort (default)")
      ->check(CLI::IsMember({"reject", "best_effort"}));
  app.add_option("--num-kv-blocks", flags.num_kv_blocks, "KV blocks in the pool");
  app.add_option("--kv-memory-mb", flags.kv_memory_mb, "KV pool budget when --num-kv-blocks is not given");
  app.add_option("--memory-budget-mb", flags.memory_budget_mb,
                 "the most this node may take for the model's weights (its pipeline stage's) and the KV pool; "
                 "a model that does not fit is refused before it is read (default: no bound)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", flags.max_model_len, "prompt + output tokens of one request");
  app.add_option("--threads", flags.threads, "worker compute threads (0: all)");
  app.add_option("--device", flags.device, "cpu | cuda | auto (cuda when a GPU answers; else the CPU, logged)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--gpu-memory-utilization", flags.gpu_memory_utilization,
                 "CUDA: share of the GPU's memory the weights and KV pool may take (0, 1]");
  app.add_option("--dtype", flags.dtype, "CUDA activations and KV pool: f32 | f16 | bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "KV cache element type: auto (CPU: f16 for quantized weights, else f32; CUDA: --dtype) | f32 | f16 | "
                 "bf16 | q8_0 | fp8_e4m3")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "q8_0", "fp8_e4m3"}));
  app.add_flag("--batch-invariant", flags.batch_invariant,
               "CPU: float weights' products sum in one order at every batch size, so a request's output "
               "does not depend on what shares its steps and the KV cache defaults to f16 (float models' "
               "prompts cost about 1.3x; quantized weights are batch invariant already)");
  app.add_option("--nano-batches", flags.nano_batches,
                 "CUDA: spread prefill and mixed steps over this many streams (1 to 4; 1: off)")
      ->check(CLI::Range(1, 4));
  app.add_option("--async-scheduling", flags.async_scheduling,
                 "on: plan step N+1 while the worker runs step N; auto (the default): on")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--tokenizer-pool-size", flags.tokenizer_pool_size, "tokenizer actors");
  app.add_option("--plugin", flags.plugins,
                 "a plugin library (include/troupe/plugin.h) and its JSON config: PATH[,CONFIG-JSON]; repeatable, "
                 "run in order after the topology's [[plugins]]")
      ->allow_extra_args(false);
  app.add_option("--api-key", flags.api_key, "require this key on every request (both doors)");
  app.add_option("--api-key-file", flags.api_key_file, "read the key from this file (surrounding whitespace ignored)");
  app.add_option("--http", flags.http, "the OpenAI-compatible HTTP API: on | off")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--http-host", flags.http_host, "host the HTTP API binds");
  app.add_option("--http-port", flags.http_port, "HTTP API port (turns the API on; 0: any free port)");
  app.add_option("--http-max-body-bytes", flags.http_max_body_bytes, "larger request bodies get 413");
  app.add_option("--http-max-connections", flags.http_max_connections, "HTTP connections served at once");
  app.add_option("--http-request-timeout-ms", flags.http_request_timeout_ms,
                 "a request's line, headers and body must arrive within this, else 408");
  app.add_option("--http-max-waiting-connections", flags.http_max_waiting_connections,
                 "HTTP connections waiting for a request at once, the longest waiting closed for a newer one "
                 "(0: a quarter of the open-files limit; else 16 to 65536)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  app.add_option("--http-max-header-bytes", flags.http_max_header_bytes, "larger request line and headers get 431");
  app.add_option("--set", flags.overrides,
                 "KEY=VALUE: override a topology file key (repeatable), e.g. http.port=8001, "
                 "nodes.engine-a.address=\"127.0.0.1:4700\"")
      ->allow_extra_args(false);  // one KEY=VALUE per --set: the file argument is never taken
  app.add_option("--served-model-name", flags.served_model_name, "the model name the HTTP API answers to");
  app.add_option("--allowed-origins", flags.allowed_origins,
                 "origins browser pages may call the HTTP API from (CORS), e.g. https://app.example.com or '*'; "
                 "repeatable or comma-separated; default none")
      ->delimiter(',');
  app.add_option("--tool-call-parser", flags.tool_call_parser,
                 "how the model writes tool calls: auto (from its chat template) | llama3_json | hermes | mistral | "
                 "openai | none");
  app.add_option("--reasoning-parser", flags.reasoning_parser,
                 "how the model writes its reasoning: auto (from its chat template) | think | harmony | none");
  app.add_option("--num-speculative-tokens", flags.num_speculative_tokens,
                 "speculative decoding: draft tokens verified per step for requests that do not choose (0: off)")
      ->check(CLI::Range(0, 16));
  app.add_option("--max-speculative-tokens", flags.max_speculative_tokens,
                 "the most draft tokens a request may ask for per step (0 to 16; default 16)")
      ->check(CLI::Range(0, 16));
  app.add_option("--draft-model", flags.draft_model,
                 "a smaller model of the same vocabulary that proposes the drafts (default: n-gram prompt lookup)");
  app.add_option("--draft-kv-memory-mb", flags.draft_kv_memory_mb, "the draft model's own KV pool (default 64)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ngram-min", flags.ngram_min, "n-gram prompt lookup: the shortest suffix matched (default 2)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ngram-max", flags.ngram_max, "n-gram prompt lookup: the longest suffix, tried first (default 4)")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", flags.log_level, "trace | debug | info | warn | error");
  app.add_option("--log-format", flags.log_format, "text | json (one JSON object per log line, every line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->each([](const std::string& name) { set_log_format(parse_log_format(name)); });
  app.add_option(
         "--drain-timeout", flags.drain_timeout_s,
         "seconds running requests may go on after SIGTERM before they end with an error (0 to 3600; default 30)")
      ->check(CLI::Range(0, 3600));
  app.add_option(
         "--log-stats-interval", flags.log_stats_interval_s,
         "seconds between throughput lines, printed only when something happened (0: off; at most 3600; default 10)")
      ->check(CLI::Range(0, 3600));
  app.add_flag("--no-access-log", flags.no_access_log, "no line per finished request");
  app.add_option(
      "--pipeline-stage", flags.pipeline_stages,
      "a remote pipeline stage holding the model's earlier layers, KVTCP_ENDPOINT@FIRST-LAST as `troupe stage` "
      "prints it; repeat in layer order from layer 0 (this engine holds the layers after the last)");
  app.add_option("--micro-batches", flags.micro_batches,
                 "pipeline stages: micro-batches a step is cut into so the stages overlap (1 to 64; default 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--pipeline-failover-wait-ms", flags.pipeline_failover_wait_ms,
                 "pipeline stages: how long requests wait for a lost stage to come back before they fail naming it "
                 "(0: at once; default 30000; [pipeline] failover_wait_ms)")
      ->check(CLI::Range(0, 3600000));
}

std::vector<std::string> given_serve_flags(const CLI::App& app) {
  // Which options are serve flags: those add_serve_flags binds, so the list is written once.
  CLI::App serve_only;
  serve_flags unused;
  add_serve_flags(serve_only, unused);
  std::vector<std::string> args;
  for (const CLI::Option* given : app.get_options()) {
    if (given->count() == 0) continue;
    const std::string name = given->get_name();
    if (serve_only.get_option_no_throw(name) == nullptr) continue;
    if (given->get_expected_max() == 0) {  // a flag: present or not
      if (given->as<bool>()) args.push_back(name);
      continue;
    }
    // One value each time: a repeated option (--set, --plugin) keeps its order.
    for (const std::string& value : given->results()) args.insert(args.end(), {name, value});
  }
  return args;
}

topology topology_from_flags(const serve_flags& flags) {
  if (flags.config.empty() && !flags.overrides.empty()) {
    throw std::runtime_error("--set overrides a topology file's keys: give the file too");
  }
  topology t = flags.config.empty() ? topology{} : load_topology(flags.config, flags.overrides);
  model_spec& m = t.model;
  // A path on the command line is the user's, relative to the working directory; it also names
  // the served model as written.
  if (!flags.model.empty()) {
    m.path = flags.model;
    t.model_path_as_written.clear();
  }
  if (!flags.load_format.empty()) m.format = parse_load_format(flags.load_format);
  if (flags.port > 0) t.zmq_endpoint = "tcp://" + flags.host + ":" + std::to_string(flags.port);
  if (!flags.zmq_endpoint.empty()) t.zmq_endpoint = flags.zmq_endpoint;
  if (flags.listen_backlog > 0) t.listen_backlog = flags.listen_backlog;
  if (flags.zmq_handshake_timeout_ms > 0) t.zmq_handshake_timeout_ms = flags.zmq_handshake_timeout_ms;
  // In 0..65536 by their checks above: no narrowing loses a bit.
  if (flags.zmq_max_pending_handshakes > 0)
    t.zmq_max_pending_handshakes = static_cast<size_t>(flags.zmq_max_pending_handshakes);
  if (flags.zmq_max_connections >= 0) t.zmq_max_connections = static_cast<size_t>(flags.zmq_max_connections);
  if (flags.max_num_seqs > 0) m.max_num_seqs = flags.max_num_seqs;
  if (flags.max_num_batched_tokens > 0) t.max_num_batched_tokens = flags.max_num_batched_tokens;
  if (flags.max_waiting_requests > 0) t.max_waiting_requests = flags.max_waiting_requests;
  // Names CLI11 has checked against the same lists the parsers accept.
  if (!flags.scheduling_policy.empty()) t.scheduling_policy = parse_scheduling_policy(flags.scheduling_policy);
  if (!flags.slo_admission.empty()) t.slo_admission = parse_slo_admission(flags.slo_admission);
  if (flags.num_kv_blocks > 0) m.num_kv_blocks = flags.num_kv_blocks;
  if (flags.kv_memory_mb > 0) m.kv_memory_mb = flags.kv_memory_mb;
  if (flags.memory_budget_mb > 0) m.memory_budget_mb = flags.memory_budget_mb;
  if (flags.max_model_len > 0) m.max_model_len = flags.max_model_len;
  if (flags.threads >= 0) m.backend.threads = flags.threads;
  if (!flags.device.empty()) m.device = parse_device_request(flags.device);
  if (flags.gpu_memory_utilization != 0.0f) m.backend.gpu_memory_utilization = flags.gpu_memory_utilization;
  if (!flags.dtype.empty()) m.backend.cuda_dtype = parse_activation_dtype(flags.dtype);
  if (flags.nano_batches > 0) m.backend.nano_batches = flags.nano_batches;
  if (!flags.kv_cache_dtype.empty()) m.backend.kv_cache_dtype = flags.kv_cache_dtype;
  if (!flags.async_scheduling.empty()) t.async_scheduling = flags.async_scheduling != "off";
  if (flags.tokenizer_pool_size > 0) t.tokenizer_pool_size = flags.tokenizer_pool_size;
  for (const std::string& plugin : flags.plugins) t.plugins.push_back(parse_plugin_argument(plugin));
  if (!flags.api_key.empty()) t.api_key = flags.api_key;
  if (!flags.api_key_file.empty()) {
    if (!flags.api_key.empty()) throw std::runtime_error("give --api-key or --api-key-file, not both");
    t.api_key = read_api_key_file(flags.api_key_file);
  }
  // Without a topology file the HTTP API is on (port 8000), as users of `vllm serve` expect; a
  // file says for itself ([http] enabled).
  if (flags.config.empty()) t.http_enabled = true;
  if (!flags.http.empty()) t.http_enabled = flags.http == "on";
  if (flags.http_port >= 0) {
    t.http_port = flags.http_port;
    t.http_enabled = true;
  }
  if (!flags.http_host.empty()) t.http_host = flags.http_host;
  if (flags.http_max_body_bytes > 0) t.http_max_body_bytes = flags.http_max_body_bytes;
  if (flags.http_max_connections > 0) t.http_max_connections = flags.http_max_connections;
  if (flags.http_max_waiting_connections >= 0) {
    t.http_max_waiting_connections = static_cast<size_t>(flags.http_max_waiting_connections);
  }
  if (flags.http_request_timeout_ms > 0) t.http_request_timeout_ms = flags.http_request_timeout_ms;
  if (flags.http_max_header_bytes > 0) t.http_max_header_bytes = flags.http_max_header_bytes;
  if (!flags.served_model_name.empty()) t.served_model_name = flags.served_model_name;
  if (!flags.allowed_origins.empty()) t.http_allowed_origins = flags.allowed_origins;
  if (!flags.tool_call_parser.empty()) t.tool_call_parser = flags.tool_call_parser;
  if (!flags.reasoning_parser.empty()) t.reasoning_parser = flags.reasoning_parser;
  speculative_settings& spec = t.speculative;
  if (flags.max_speculative_tokens >= 0) spec.max_draft_tokens = flags.max_speculative_tokens;
  if (flags.num_speculative_tokens >= 0) {
    spec.num_draft_tokens = flags.num_speculative_tokens;
    // Asking for more drafts than the file's limit raises the limit.
    if (flags.max_speculative_tokens < 0)
      spec.max_draft_tokens = std::max(spec.max_draft_tokens, spec.num_draft_tokens);
  }
  if (!flags.draft_model.empty()) spec.draft_model = flags.draft_model;
  if (flags.draft_kv_memory_mb > 0) spec.draft_kv_memory_mb = flags.draft_kv_memory_mb;
  if (flags.ngram_min > 0) spec.ngram.min_n = flags.ngram_min;
  if (flags.ngram_max > 0) spec.ngram.max_n = flags.ngram_max;
  if (flags.drain_timeout_s >= 0) t.drain_timeout_s = flags.drain_timeout_s;
  if (flags.log_stats_interval_s >= 0) t.log_stats_interval_s = flags.log_stats_interval_s;
  if (flags.no_access_log) t.access_log = false;
  if (!flags.pipeline_stages.empty()) {
    t.pipeline.stages.clear();
    t.pipeline_stage_nodes.clear();
    t.pipeline_split_nodes.clear();
    for (const std::string& text : flags.pipeline_stages) t.pipeline.stages.push_back(parse_remote_stage(text));
  }
  if (flags.micro_batches > 0) t.pipeline.micro_batches = flags.micro_batches;
  if (flags.pipeline_failover_wait_ms >= 0) t.pipeline.failover_wait_ms = flags.pipeline_failover_wait_ms;
  split_pipeline_by_bytes(t);           // after --model: the bytes are the served model's
  resolve_pipeline_stage_endpoints(t);  // after --set: the credentials decide kvtcp:// or curve://
  t.validate();
  return t;
}

}  // namespace troupe::cli
