// troupe stage: serves a pipeline stage of a model (its earlier layers) to the engine that holds
// the rest (`troupe serve --pipeline-stage ENDPOINT@LAYERS`, or [pipeline] in a topology), until
// SIGTERM or SIGINT. Prints the endpoint to connect to.

#include <csignal>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "backends/backend_selection.hpp"
#include "cli/command_registry.hpp"
#include "doors/operator_log.hpp"
#include "engine/served_model.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "model/layer_range.hpp"
#include "pipeline/stage_server.hpp"

namespace troupe::cli {
namespace {

struct stage_flags {
  std::string model_path;
  std::string load_format = "auto";
  std::string layers;
  std::string host = "127.0.0.1";
  int port = 0;
  int threads = 0;
  int block_size = 16;
  int num_kv_blocks = 0;
  int kv_memory_mb = 512;
  int memory_budget_mb = 0;
  std::string kv_cache_dtype = "auto";
  int max_tokens = 1 << 16;
  std::string log_level = "info";
  std::string log_format = "text";  // applied while the command line is parsed
  std::string credentials;          // the cluster's credentials directory: the link is CURVE-authenticated
  std::string name;                 // this stage's member name there
};

// Waits for SIGTERM or SIGINT (blocked in every thread started after this, so sigwait takes it).
class stop_signals {
 public:
  stop_signals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  int wait() const {
    int signal = 0;
    sigwait(&set_, &signal);
    return signal;
  }

 private:
  sigset_t set_;
};

int run_stage(const stage_flags& flags) {
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  const stop_signals signals;  // before any thread starts
  model_spec spec;
  spec.path = flags.model_path;
  spec.format = parse_load_format(flags.load_format);
  spec.device = device_request::cpu;
  spec.backend.threads = flags.threads;
  spec.backend.kv_cache_dtype = flags.kv_cache_dtype;
  spec.block_size = flags.block_size;
  spec.num_kv_blocks = flags.num_kv_blocks;
  spec.kv_memory_mb = flags.kv_memory_mb;
  spec.memory_budget_mb = flags.memory_budget_mb;
  // The layer range is checked against the model once its config is read (the loader's check).
  spec.backend.layers = parse_layer_range(flags.layers, std::numeric_limits<int>::max());
  std::shared_ptr<served_model> served = load_served_model(spec);
  stage_server_settings settings;
  settings.host = flags.host;
  settings.port = flags.port;
  settings.limits.max_tokens = flags.max_tokens;
  if (!flags.credentials.empty()) {
    if (flags.name.empty()) throw std::runtime_error("--credentials needs --name (this stage's member name)");
    settings.keys = load_kv_channel_keys(flags.credentials, flags.name);
  }
  stage_server server(*served->backend_model, spec.backend.layers, settings);
  spdlog::info("pipeline stage {} of {}: {}", layer_range_text(spec.backend.layers), flags.model_path,
               served->backend_model->backend_name());
  spdlog::info("pipeline stage {} listening on {}", layer_range_text(spec.backend.layers), server.endpoint());
  std::cout << server.endpoint() << "@" << layer_range_text(spec.backend.layers) << std::endl;
  const int signal = signals.wait();
  spdlog::info("pipeline stage {}: {} received, stopping after {} frames", layer_range_text(spec.backend.layers),
               signal == SIGINT ? "SIGINT" : "SIGTERM", server.frames_computed());
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<stage_flags>();
  auto* app = parent.add_subcommand(
      "stage", "serve a pipeline stage (a model's earlier layers) to the engine that holds the rest");
  app->add_option("--model", flags->model_path, "HF directory or .gguf file")->required();
  app->add_option("--load-format", flags->load_format, "auto | safetensors | gguf | dummy");
  app->add_option("--layers", flags->layers, "the layers this stage holds, FIRST-LAST (both included), from layer 0 on")
      ->required();
  app->add_option("--host", flags->host, "where to listen (loopback only without --credentials)");
  app->add_option("--port", flags->port, "the port to listen on (0: any free one; the endpoint is printed)")
      ->check(CLI::Range(0, 65535));
  app->add_option("--threads", flags->threads, "compute threads (0: one per hardware thread)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--block-size", flags->block_size, "tokens per KV block; must equal the engine's (default 16)")
      ->check(CLI::PositiveNumber);
  app->add_option("--num-kv-blocks", flags->num_kv_blocks, "KV blocks of this stage's layers (0: from --kv-memory-mb)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--kv-memory-mb", flags->kv_memory_mb, "KV budget of this stage's layers (default 512)")
      ->check(CLI::PositiveNumber);
  app->add_option("--memory-budget-mb", flags->memory_budget_mb,
                  "the most this stage may take for its layers' weights and KV pool; more is refused before it is read")
      ->check(CLI::PositiveNumber);
  app->add_option("--kv-cache-dtype", flags->kv_cache_dtype, "auto | f32 | f16 | bf16 | q8_0 | fp8_e4m3");
  app->add_option("--max-batch-tokens", flags->max_tokens, "the most tokens one micro-batch may carry (default 65536)")
      ->check(CLI::PositiveNumber);
  app->add_option("--credentials", flags->credentials,
                  "the cluster's credentials (troupe certs): the stage serves curve:// and admits members only; "
                  "without them it serves kvtcp:// on loopback");
  app->add_option("--name", flags->name, "this stage's member name in --credentials (NAME.kv.key)");
  app->add_option("--log-level", flags->log_level, "trace | debug | info | warn | error");
  app->add_option("--log-format", flags->log_format, "text | json (one JSON object per log line)")
      ->each([](const std::string& name) { set_log_format(parse_log_format(name)); });
  return command{app, [flags] { return run_stage(*flags); }};
});

}  // namespace
}  // namespace troupe::cli
