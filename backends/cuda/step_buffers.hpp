#pragma once
// What one forward step of a CUDA model reads and writes besides the weights and the KV pool:
// the step's forward_batch packed at fixed offsets (host-pinned, uploaded in one copy) with the
// attention plan's work items, and the activation buffers of its rows. The buffers only grow, and
// a captured CUDA graph keeps reading the same addresses, so `ensure` says when anything moved
// (the graphs go stale).

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/paged_attention.hpp"
#include "model/dtype.hpp"
#include "model/forward_batch.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"

namespace troupe::cuda {

struct step_capacity {
  int tokens = 0, seqs = 0, block_ids = 0, work = 0, logits = 0;
};

// Throws std::runtime_error ("cuda model forward: ...") naming what of `batch` does not fit the
// model or its pool: sizes, ranges, token ids, slots, block ids, logits rows.
void check_cuda_batch(const forward_batch& batch, const model_config& config, kv_cache_shape kv_shape);

class step_buffers {
 public:
  step_buffers(const model_config& config, dtype activation) : config_(config), activation_(activation) {}

  // Grows the buffers to hold `need` (geometrically) and the attention's split partials to
  // `workspace_floats`; true when anything moved.
  bool ensure(step_capacity need, size_t workspace_floats);

  // Writes the step into the pinned copy: `rows` token rows and `seqs` sequences (a decode
  // batch padded to its graph's bucket: padding rows write no KV and see no context), the plan's
  // work items and `logits_rows` rows to gather. Returns the bytes to upload.
  size_t pack(const forward_batch& batch, int rows, int seqs, const std::vector<int32_t>& query_start,
              const paged_attention_plan& plan, int logits_rows);
  // Queues the upload of the first `bytes` of the pinned copy on `stream`.
  void upload(size_t bytes, cudaStream_t stream);

  // The packed step on the device.
  const int64_t* slots() const { return device_at<int64_t>(off_slots_); }
  const int32_t* tokens() const { return device_at<int32_t>(off_tokens_); }
  const int32_t* positions() const { return device_at<int32_t>(off_positions_); }
  const int32_t* query_start() const { return device_at<int32_t>(off_query_start_); }
  const int32_t* context_lengths() const { return device_at<int32_t>(off_context_); }
  const int32_t* block_table_start() const { return device_at<int32_t>(off_table_start_); }
  const int32_t* block_tables() const { return device_at<int32_t>(off_tables_); }
  const int32_t* work_items() const { return device_at<int32_t>(off_work_); }
  const int32_t* logits_rows() const { return device_at<int32_t>(off_logits_rows_); }

  // Activations, in the activation dtype unless said.
  device_buffer residual;   // [tokens, hidden]
  device_buffer block_out;  // [tokens, hidden] output of o_proj / down_proj
  device_buffer normed;     // [tokens, hidden]
  device_buffer qkv;        // [tokens, (num_heads + 2 * num_kv_heads) * head_dim]
  device_buffer attn_out;   // [tokens, num_heads * head_dim]
  device_buffer gate_up;    // [tokens, 2 * intermediate]
  device_buffer act;        // [tokens, intermediate]
  device_buffer gathered;   // [logits, hidden]
  device_buffer logits;     // [logits, vocab] f32
  device_buffer workspace;  // attention split partials (f32)

 private:
  void layout();
  template <typename T>
  T* host_at(size_t offset) {
    return reinterpret_cast<T*>(meta_host_.as<char>() + offset);
  }
  template <typename T>
  T* device_at(size_t offset) const {
    return reinterpret_cast<T*>(meta_device_.as<char>() + offset);
  }

  model_config config_;
  dtype activation_;
  step_capacity capacity_;
  size_t meta_bytes_ = 0;
  size_t off_slots_ = 0, off_tokens_ = 0, off_positions_ = 0, off_query_start_ = 0, off_context_ = 0,
         off_table_start_ = 0, off_work_ = 0, off_logits_rows_ = 0, off_tables_ = 0;
  device_buffer meta_device_;
  pinned_buffer meta_host_;
};

}  // namespace troupe::cuda
