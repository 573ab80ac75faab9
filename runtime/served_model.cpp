#include "runtime/served_model.hpp"

#include <spdlog/spdlog.h>

#include "kernels/cpu/cpu_model.hpp"
#include "kernels/loader/tokenizer_sources.hpp"

namespace troupe {

std::shared_ptr<served_model> load_served_model(const topology& t) {
  if (t.device != "cpu") {
    throw std::runtime_error("device \"" + t.device + "\" is not served by this build's runtime yet; use device = \"cpu\"");
  }
  if (t.model_path.empty()) throw std::runtime_error("no model given (set [model] path or --model)");
  auto served = std::make_shared<served_model>();
  load_options options;
  options.path = t.model_path;
  options.format = parse_load_format(t.load_format);
  options.show_progress = false;
  served->loaded = load_model(options);
  const model_config& config = served->loaded.config;

  int num_blocks = t.num_kv_blocks;
  if (num_blocks == 0) {
    num_blocks = cpu_kv_blocks_for_budget(config, static_cast<size_t>(t.kv_memory_mb) << 20, t.block_size);
  }
  if (num_blocks <= 0) throw std::runtime_error("the KV budget holds no block; raise kv_memory_mb or num_kv_blocks");
  served->backend_model = make_cpu_model(config, served->loaded.weights, kv_cache_shape{num_blocks, t.block_size}, t.threads);

  auto sources = load_tokenizer_sources(t.model_path);
  served->tok = std::make_unique<tokenizer>(tokenizer::from_json(sources.tokenizer_json, sources.tokenizer_config));

  served->max_model_len = config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
  if (t.max_model_len > 0) served->max_model_len = std::min(served->max_model_len, t.max_model_len);
  spdlog::info("model {} ({}, {} layers, hidden {}, vocab {}): {} KV blocks of {} tokens, context {}",
               served->loaded.source.string(), config.architecture_name, config.num_layers,
               config.hidden_size, config.vocab_size, num_blocks, t.block_size, served->max_model_len);
  return served;
}

}  // namespace troupe
