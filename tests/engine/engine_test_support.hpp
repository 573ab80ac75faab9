#pragma once
// Helpers for engine tests that need no real model.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine/scheduler.hpp"
#include "model/model.hpp"

namespace troupe::testing {

inline constexpr int32_t test_eos = 2;

inline std::unique_ptr<scheduler> create_scheduler(int num_blocks, int block_size = 16,
                                                   int max_num_batched_tokens = 8192, int max_num_seqs = 128,
                                                   bool enable_prefix_caching = true, int max_waiting_requests = 1024,
                                                   int max_model_len = 4096) {
  engine_config config;
  config.num_kv_blocks = num_blocks;
  config.block_size = block_size;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = max_num_seqs;
  config.enable_prefix_caching = enable_prefix_caching;
  config.max_waiting_requests = max_waiting_requests;
  config.max_model_len = max_model_len;
  return std::make_unique<scheduler>(config, std::vector<int32_t>{test_eos});
}

inline std::vector<int32_t> make_prompt(int length, int32_t first = 10) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(first + i);
  return ids;
}

inline sampling_params greedy(int max_tokens, bool ignore_eos = true) {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

// A stand-in for a worker: the token sampled for a request's k-th output is 1000 + k, so a
// recomputed sequence must come back with the same tokens.
inline step_result fake_run(const step_plan& plan) {
  step_result result;
  result.step_id = plan.step_id;
  for (const auto& s : plan.sequences) {
    if (s.sample) result.tokens.push_back({s.request_id, 1000 + s.output_index, 0.0f, {}, {}});
  }
  return result;
}

// A model whose "KV cache" stores token ids: for every sequence it reads its whole context back
// through the block table and predicts a token from it. Any mistake in slot mapping, block
// tables, prefix sharing or recomputation changes what it predicts.
class kv_echo_model : public model {
 public:
  kv_echo_model(int num_blocks, int block_size, int vocab_size) {
    config_.vocab_size = vocab_size;
    config_.max_position_embeddings = 4096;
    config_.eos_token_ids = {test_eos};
    shape_ = {num_blocks, block_size};
    slots_.assign(static_cast<size_t>(num_blocks) * block_size, -1);
  }

  // The token that follows `context`, as this model predicts it (never an id below 3).
  static int32_t next_token(const std::vector<int32_t>& context, int vocab_size) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : context) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return static_cast<int32_t>(3 + h % static_cast<uint64_t>(vocab_size - 3));
  }

  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return shape_; }
  std::string backend_name() const override { return "kv_echo"; }

  void forward(const forward_batch& batch, float* logits) override {
    ++num_forwards;
    max_batch_tokens = std::max(max_batch_tokens, batch.num_tokens());
    for (int i = 0; i < batch.num_tokens(); ++i) slots_.at(batch.slot_mapping[i]) = batch.token_ids[i];
    int row = 0;
    for (int s = 0; s < batch.num_seqs(); ++s) {
      const int last_row = batch.query_start[s + 1] - 1;
      if (row >= batch.num_logits() || batch.logits_rows[row] != last_row) continue;
      std::vector<int32_t> context;
      for (int pos = 0; pos < batch.context_lengths[s]; ++pos) {
        int32_t block = batch.block_tables[batch.block_table_start[s] + pos / shape_.block_size];
        int32_t token = slots_.at(static_cast<size_t>(block) * shape_.block_size + pos % shape_.block_size);
        if (token < 0) throw std::runtime_error("kv_echo_model: read an unwritten KV slot");
        context.push_back(token);
      }
      float* out = logits + static_cast<size_t>(row) * config_.vocab_size;
      for (int v = 0; v < config_.vocab_size; ++v) out[v] = 0.0f;
      out[next_token(context, config_.vocab_size)] = 5.0f;
      ++row;
    }
  }

  int num_forwards = 0;
  int max_batch_tokens = 0;

 private:
  model_config config_;
  kv_cache_shape shape_;
  std::vector<int32_t> slots_;  // [num_blocks * block_size] the token whose "K/V" each slot holds
};

}  // namespace troupe::testing
