#include "engine/served_model.hpp"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backends/cpu/cpu_model.hpp"
#include "engine/process_memory.hpp"
#include "model/architecture.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "protocol/protocol_limits.hpp"

namespace troupe {

namespace {

// This process's RSS and peak against the weights' bytes and the KV pool's, for the load log
// ("memory after load: RSS 991.0 MiB (peak 1045.0 MiB); weights 636.9 MiB, KV pool 44.0 MiB").
void log_memory_after_load(const served_model& served) {
  const troupe::model& m = *served.backend_model;
  const kv_cache_shape shape = m.kv_shape();
  size_t kv_bytes = 0;
  try {
    kv_bytes = kv_span_bytes(kv_span_for(m.config(), shape, shape.num_blocks, 0, m.config().num_layers, m.kv_dtype()));
  } catch (const std::exception&) {
    // A backend without a KV element type to name: its pool is left out of the line.
  }
  const process_memory memory = current_process_memory();
  constexpr double mib = 1 << 20;
  spdlog::info("memory after load: RSS {:.1f} MiB (peak {:.1f} MiB); weights {:.1f} MiB, KV pool {:.1f} MiB",
               memory.resident_bytes / mib, memory.peak_bytes / mib, served.loaded.weights.total_bytes() / mib,
               kv_bytes / mib);
}

}  // namespace

void model_spec::validate() const {
  if (path.empty()) throw std::runtime_error("no model given (set [model] path or --model)");
  validate_settings();
}

void model_spec::validate_settings() const {
  backend.validate();
  auto positive = [](int value, const char* name) {
    if (value <= 0) throw std::runtime_error(std::string(name) + " must be positive, got " + std::to_string(value));
  };
  positive(block_size, "block_size");
  positive(max_num_seqs, "max_num_seqs");
  if (num_kv_blocks < 0) throw std::runtime_error("num_kv_blocks must be 0 (from memory) or positive");
  if (num_kv_blocks == 0) positive(kv_memory_mb, "kv_memory_mb (when num_kv_blocks is 0)");
  if (memory_budget_mb < 0) throw std::runtime_error("memory_budget_mb must be 0 (no bound) or positive");
  if (memory_budget_mb > 0 && num_kv_blocks == 0 && kv_memory_mb >= memory_budget_mb) {
    throw std::runtime_error("the KV budget of " + std::to_string(kv_memory_mb) +
                             " MiB leaves nothing of the memory budget of " + std::to_string(memory_budget_mb) +
                             " MiB for the weights");
  }
  if (max_model_len < 0 || max_model_len > max_served_model_len) {
    throw std::runtime_error("max_model_len must be 0 (the model's) or 1.." + std::to_string(max_served_model_len) +
                             " (the longest context served), got " + std::to_string(max_model_len));
  }
}

engine_config served_model::base_engine_config() const {
  engine_config config;
  config.block_size = backend_model->kv_shape().block_size;
  config.num_kv_blocks = backend_model->kv_shape().num_blocks;
  config.max_model_len = max_model_len;
  config.vocab_size = backend_model->config().vocab_size;
  config.hidden_size = backend_model->config().hidden_size;
  config.kv_window = attention_reach(backend_model->config());
  return config;
}

std::unique_ptr<tokenizer> load_model_tokenizer(const std::string& model_path) {
  std::filesystem::path path = model_path;
  // Dummy weights may be given as a config.json: the tokenizer lives beside it.
  if (std::filesystem::is_regular_file(path) && path.extension() == ".json" && path.filename() != "tokenizer.json") {
    path = path.parent_path();
  }
  auto sources = load_tokenizer_sources(path);
  return std::make_unique<tokenizer>(tokenizer::from_json(sources.tokenizer_json, sources.tokenizer_config));
}

std::shared_ptr<served_model> load_served_model(const model_spec& spec, std::unique_ptr<tokenizer> tok) {
  spec.validate();
  auto served = std::make_shared<served_model>();
  served->tok = tok ? std::move(tok) : load_model_tokenizer(spec.path);

  load_options options;
  options.path = spec.path;
  options.format = spec.format;
  options.show_progress = false;
  options.layers = spec.backend.layers;
  if (spec.memory_budget_mb > 0) {
    // The KV pool takes its budget; the weights get the rest (a pool of num_kv_blocks is not counted).
    const uint64_t kv_mb = spec.num_kv_blocks == 0 ? static_cast<uint64_t>(spec.kv_memory_mb) : 0;
    options.max_weight_bytes = (static_cast<uint64_t>(spec.memory_budget_mb) - kv_mb) << 20;
    options.budget_note = "a memory budget of " + std::to_string(spec.memory_budget_mb) + " MiB, " +
                          std::to_string(kv_mb) + " MiB of it the KV pool's";
  }
  served->loaded = load_model(options);
  const model_config& config = served->loaded.config;

  const device_choice device = choose_device(spec.device);
  served->device_note = device.fallback_reason;
  served->max_model_len = config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
  // A model trained past the longest context served is served at it (the requests' checks allow
  // no more): what /v1/models reports is then what a request may use.
  served->max_model_len = std::min(served->max_model_len, max_served_model_len);
  if (spec.max_model_len > config.max_position_embeddings && config.max_position_embeddings > 0) {
    // Positions past the model's trained length give garbage, not a longer context: refused, as
    // vLLM refuses it, rather than quietly cut.
    throw std::runtime_error("--max-model-len " + std::to_string(spec.max_model_len) +
                             " is above the model's limit of " + std::to_string(config.max_position_embeddings) +
                             " tokens (max_position_embeddings of " + spec.path + ")");
  }
  if (spec.max_model_len > 0) served->max_model_len = spec.max_model_len;
  // The CUDA attention has no window yet: a model whose every layer slides (Mistral v0.1) serves
  // its window as its context there, which equals sliding attention inside it, rather than
  // attending further than it was trained to.
  const int reach = attention_reach(config);
  const bool window_caps_context = device.kind == device_kind::cuda && reach > 0 && reach < served->max_model_len;
  if (window_caps_context) {
    if (spec.max_model_len > reach) {
      throw std::runtime_error("--max-model-len " + std::to_string(spec.max_model_len) +
                               " is above the sliding window of " + std::to_string(reach) +
                               " tokens, which caps the context on CUDA (use --device cpu)");
    }
    served->max_model_len = reach;
  }

  kv_pool_request kv;
  kv.num_blocks = spec.num_kv_blocks;  // 0: CPU from kv_memory_mb, CUDA from gpu_memory_utilization
  kv.block_size = spec.block_size;
  kv.cpu_budget_bytes = static_cast<size_t>(spec.kv_memory_mb) << 20;
  // Every running sequence at full length is all a pool sized from memory can be used for.
  const int64_t blocks_per_sequence = (served->max_model_len + spec.block_size - 1) / spec.block_size;
  kv.max_useful_blocks = static_cast<int>(std::min<int64_t>(int64_t(spec.max_num_seqs) * blocks_per_sequence, 1 << 30));
  // longrope (Phi-3) picks its short or long factors by the context the model serves, as
  // llama.cpp does by its context size: build the model for the context it will be run at.
  model_config run_config = config;
  if (run_config.rope_scaling && run_config.rope_scaling->type == rope_scaling_type::longrope) {
    run_config.max_position_embeddings = served->max_model_len;
  }
  if (window_caps_context) run_config.max_position_embeddings = served->max_model_len;
  served->backend_model = make_backend_model(run_config, served->loaded.weights, device.kind, kv, spec.backend);
  // Memory after load is the weights once: the loader's copies the backend repacked are freed.
  served->loaded.weights.release_copies(cpu_weights_not_read(*served->backend_model));
  return_freed_memory();
  log_memory_after_load(*served);

  for (int id : config.eos_token_ids) served->eos_token_ids.push_back(id);
  for (int32_t id : served->tok->eos_token_ids()) {
    if (std::find(served->eos_token_ids.begin(), served->eos_token_ids.end(), id) == served->eos_token_ids.end()) {
      served->eos_token_ids.push_back(id);
    }
  }
  return served;
}

std::string describe(const served_model& served) {
  const model_config& config = served.loaded.config;
  const kv_cache_shape shape = served.backend_model->kv_shape();
  return fmt::format("model {} ({}, {}, {} layers, hidden {}, vocab {}) on {}: {} KV blocks of {} tokens, context {}",
                     served.loaded.source.string(), config.architecture_name, served.loaded.quantization,
                     config.num_layers, config.hidden_size, config.vocab_size, served.backend_model->backend_name(),
                     shape.num_blocks, shape.block_size, served.max_model_len);
}

}  // namespace troupe
