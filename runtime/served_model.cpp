#include "runtime/served_model.hpp"

#include <spdlog/spdlog.h>

#include "engine/backend_selection.hpp"
#include "kernels/loader/tokenizer_sources.hpp"

namespace troupe {

std::shared_ptr<served_model> load_served_model(const topology& t) {
  if (t.model_path.empty()) throw std::runtime_error("no model given (set [model] path or --model)");
  auto served = std::make_shared<served_model>();
  load_options options;
  options.path = t.model_path;
  options.format = parse_load_format(t.load_format);
  options.show_progress = false;
  served->loaded = load_model(options);
  const model_config& config = served->loaded.config;

  const device_choice device = choose_device(t.device);
  if (!device.fallback_reason.empty()) {
    spdlog::log(t.device == "cuda" ? spdlog::level::warn : spdlog::level::info, "{}", device.fallback_reason);
  }
  kv_pool_request kv;
  kv.num_blocks = t.num_kv_blocks;  // 0: CPU from kv_memory_mb, CUDA from gpu_memory_utilization
  kv.block_size = t.block_size;
  kv.cpu_budget_bytes = static_cast<size_t>(t.kv_memory_mb) << 20;
  {
    // Every running sequence at full length is all a pool sized from memory can be used for.
    const int64_t context = t.max_model_len > 0 ? t.max_model_len
                            : config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
    const int64_t useful = static_cast<int64_t>(t.max_num_seqs) * ((context + t.block_size - 1) / t.block_size);
    kv.max_useful_blocks = static_cast<int>(std::min<int64_t>(useful, 1 << 30));
  }
  backend_options backend;
  backend.threads = t.threads;
  backend.gpu_memory_utilization = t.gpu_memory_utilization;
  backend.cuda_dtype = t.dtype;
  backend.nano_batches = t.nano_batches;
  served->backend_model = make_backend_model(config, served->loaded.weights, device.kind, kv, backend);
  served->device = device.kind;
  const int num_blocks = served->backend_model->kv_shape().num_blocks;

  auto sources = load_tokenizer_sources(t.model_path);
  served->tok = std::make_unique<tokenizer>(tokenizer::from_json(sources.tokenizer_json, sources.tokenizer_config));

  served->max_model_len = config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
  if (t.max_model_len > 0) served->max_model_len = std::min(served->max_model_len, t.max_model_len);
  spdlog::info("model {} ({}, {} layers, hidden {}, vocab {}) on {}: {} KV blocks of {} tokens, context {}",
               served->loaded.source.string(), config.architecture_name, config.num_layers,
               config.hidden_size, config.vocab_size, served->backend_model->backend_name(), num_blocks,
               t.block_size, served->max_model_len);
  return served;
}

}  // namespace troupe
