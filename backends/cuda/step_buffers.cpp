#include "backends/cuda/step_buffers.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

void check_cuda_batch(const forward_batch& b, const model_config& config, kv_cache_shape kv_shape) {
  const int n = b.num_tokens(), seqs = b.num_seqs();
  auto fail = [](const std::string& what) { throw std::runtime_error("cuda model forward: " + what); };
  if (!b.hidden_rows.empty()) fail("hidden states (embeddings) are computed on the CPU backend only, for now");
  if (static_cast<int>(b.positions.size()) != n || static_cast<int>(b.slot_mapping.size()) != n) {
    fail("positions and slot_mapping must have one entry per token (" + std::to_string(n) + ")");
  }
  if (static_cast<int>(b.query_start.size()) != seqs + 1 || static_cast<int>(b.block_table_start.size()) != seqs + 1) {
    fail("query_start and block_table_start must have num_seqs + 1 = " + std::to_string(seqs + 1) + " entries");
  }
  if (b.query_start[0] != 0 || b.query_start[seqs] != n) fail("query_start must run from 0 to num_tokens");
  if (b.block_table_start[0] != 0 || b.block_table_start[seqs] != static_cast<int>(b.block_tables.size())) {
    fail("block_table_start must run from 0 to block_tables.size()");
  }
  const int64_t num_slots = int64_t{kv_shape.num_blocks} * kv_shape.block_size;
  for (int s = 0; s < seqs; ++s) {
    const int q_len = b.query_start[s + 1] - b.query_start[s];
    const int blocks = b.block_table_start[s + 1] - b.block_table_start[s];
    if (q_len < 0 || blocks < 0) fail("query_start and block_table_start must not decrease");
    if (b.context_lengths[s] < q_len) {
      fail("sequence " + std::to_string(s) + " has context length " + std::to_string(b.context_lengths[s]) +
           " shorter than its " + std::to_string(q_len) + " new tokens");
    }
    if (int64_t{blocks} * kv_shape.block_size < b.context_lengths[s]) {
      fail("sequence " + std::to_string(s) + " has " + std::to_string(blocks) + " blocks for context length " +
           std::to_string(b.context_lengths[s]));
    }
  }
  for (int32_t block : b.block_tables) {
    if (block < 0 || block >= kv_shape.num_blocks) {
      fail("block id " + std::to_string(block) + " outside the pool of " + std::to_string(kv_shape.num_blocks));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (b.token_ids[i] < 0 || b.token_ids[i] >= config.vocab_size) {
      fail("token id " + std::to_string(b.token_ids[i]) + " outside the vocabulary of " +
           std::to_string(config.vocab_size));
    }
    if (b.slot_mapping[i] >= num_slots) {
      fail("slot " + std::to_string(b.slot_mapping[i]) + " outside the pool of " + std::to_string(num_slots));
    }
  }
  for (int32_t row : b.logits_rows) {
    if (row < 0 || row >= n) fail("logits row " + std::to_string(row) + " outside the batch of " + std::to_string(n));
  }
}

bool step_buffers::ensure(step_capacity need, size_t workspace_floats) {
  bool grew = false;
  auto grow = [](int& have, int want) {
    if (want <= have) return false;
    have = std::max(want, have + have / 2);
    return true;
  };
  step_capacity& cap = capacity_;
  const bool meta_grew = grow(cap.tokens, need.tokens) | grow(cap.seqs, need.seqs) |
                         grow(cap.block_ids, need.block_ids) | grow(cap.work, need.work) |
                         grow(cap.logits, need.logits);
  if (meta_grew || !meta_device_) {
    layout();
    meta_device_.allocate(meta_bytes_);
    meta_host_.allocate(meta_bytes_);
    const model_config& c = config_;
    const size_t t = row_bytes(activation_, 1), n = cap.tokens;
    residual.allocate(n * c.hidden_size * t);
    block_out.allocate(n * c.hidden_size * t);
    normed.allocate(n * c.hidden_size * t);
    qkv.allocate(n * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim * t);
    attn_out.allocate(n * c.num_heads * c.head_dim * t);
    gate_up.allocate(n * 2 * c.intermediate_size * t);
    act.allocate(n * c.intermediate_size * t);
    gathered.allocate(static_cast<size_t>(cap.logits) * c.hidden_size * t);
    logits.allocate(static_cast<size_t>(cap.logits) * c.vocab_size * 4);
    grew = true;
  }
  if (workspace_floats * sizeof(float) > workspace.size()) {
    workspace.allocate(std::max(workspace_floats * sizeof(float), workspace.size() * 3 / 2));
    grew = true;
  }
  return grew;
}

void step_buffers::layout() {
  const step_capacity& cap = capacity_;
  size_t offset = 0;
  auto place = [&](size_t& field, size_t bytes) {
    field = offset;
    offset += (bytes + 15) / 16 * 16;
  };
  place(off_slots_, cap.tokens * sizeof(int64_t));
  place(off_tokens_, cap.tokens * 4);
  place(off_positions_, cap.tokens * 4);
  place(off_query_start_, (cap.seqs + 1) * 4);
  place(off_context_, cap.seqs * 4);
  place(off_table_start_, (cap.seqs + 1) * 4);
  place(off_work_, cap.work * 2 * 4);
  place(off_logits_rows_, cap.logits * 4);
  place(off_tables_, cap.block_ids * 4);  // last: a step copies only what it uses of it
  meta_bytes_ = offset;
}

size_t step_buffers::pack(const forward_batch& b, int rows, int seqs, const std::vector<int32_t>& query_start,
                          const paged_attention_plan& plan, int logits_rows) {
  const int real = b.num_tokens(), real_seqs = b.num_seqs();
  int64_t* slots = host_at<int64_t>(off_slots_);
  int32_t* tokens = host_at<int32_t>(off_tokens_);
  int32_t* positions = host_at<int32_t>(off_positions_);
  for (int i = 0; i < rows; ++i) {
    const bool padding = i >= real;
    slots[i] = padding ? -1 : b.slot_mapping[i];
    tokens[i] = padding ? 0 : b.token_ids[i];
    positions[i] = padding ? 0 : b.positions[i];
  }
  std::memcpy(host_at<int32_t>(off_query_start_), query_start.data(), (seqs + 1) * 4);
  int32_t* context = host_at<int32_t>(off_context_);
  int32_t* table_start = host_at<int32_t>(off_table_start_);
  for (int s = 0; s < seqs; ++s) {
    context[s] = s < real_seqs ? b.context_lengths[s] : 0;
    table_start[s] = s < real_seqs ? b.block_table_start[s] : b.block_table_start[real_seqs];
  }
  table_start[seqs] = b.block_table_start[real_seqs];
  std::memcpy(host_at<int32_t>(off_work_), plan.work_items.data(), plan.work_items.size() * 4);
  int32_t* logits_rows_host = host_at<int32_t>(off_logits_rows_);
  for (int i = 0; i < logits_rows; ++i) logits_rows_host[i] = i < b.num_logits() ? b.logits_rows[i] : i;
  std::memcpy(host_at<int32_t>(off_tables_), b.block_tables.data(), b.block_tables.size() * 4);
  return off_tables_ + b.block_tables.size() * 4;
}

void step_buffers::upload(size_t bytes, cudaStream_t stream) {
  check(cudaMemcpyAsync(meta_device_.get(), meta_host_.get(), bytes, cudaMemcpyHostToDevice, stream),
        "upload step metadata");
}

}  // namespace troupe::cuda
