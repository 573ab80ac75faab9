#include "backends/cpu/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "backends/cpu/row_kernels.hpp"

namespace troupe::cpu {

namespace {

constexpr int query_tile = 16;

[[noreturn]] void bad_batch(const std::string& what) {
  throw std::runtime_error("forward_batch: " + what);
}

}  // namespace

void check_attention_batch(const forward_batch& batch, const attention_shape& shape) {
  const int num_seqs = batch.num_seqs();
  if (static_cast<int>(batch.query_start.size()) != num_seqs + 1) {
    bad_batch("query_start has " + std::to_string(batch.query_start.size()) +
              " entries, expected num_seqs + 1 = " + std::to_string(num_seqs + 1));
  }
  if (static_cast<int>(batch.block_table_start.size()) != num_seqs + 1) {
    bad_batch("block_table_start has " + std::to_string(batch.block_table_start.size()) +
              " entries, expected num_seqs + 1 = " + std::to_string(num_seqs + 1));
  }
  if (batch.query_start[0] != 0 || batch.query_start[num_seqs] != batch.num_tokens()) {
    bad_batch("query_start must run from 0 to num_tokens = " + std::to_string(batch.num_tokens()));
  }
  for (int s = 0; s < num_seqs; ++s) {
    const int num_new = batch.query_start[s + 1] - batch.query_start[s];
    const int context = batch.context_lengths[s];
    if (num_new < 0 || context < num_new) {
      bad_batch("sequence " + std::to_string(s) + " has " + std::to_string(num_new) +
                " new tokens and context length " + std::to_string(context) +
                " (expected 0 <= new <= context)");
    }
    const int first = batch.block_table_start[s];
    const int last = batch.block_table_start[s + 1];
    const int needed = (context + shape.block_size - 1) / shape.block_size;
    if (first < 0 || last < first || last > static_cast<int>(batch.block_tables.size()) ||
        last - first < needed) {
      bad_batch("sequence " + std::to_string(s) + " needs " + std::to_string(needed) +
                " blocks for context " + std::to_string(context) + ", its block table has " +
                std::to_string(last - first));
    }
    for (int b = first; b < first + needed; ++b) {
      if (batch.block_tables[b] < 0 || batch.block_tables[b] >= shape.num_blocks) {
        bad_batch("sequence " + std::to_string(s) + " uses block " +
                  std::to_string(batch.block_tables[b]) + ", outside the pool of " +
                  std::to_string(shape.num_blocks) + " blocks");
      }
    }
  }
}

void paged_attention(thread_pool& pool, const float* q, int64_t ldq, const float* key_pool,
                     const float* value_pool, const forward_batch& batch,
                     const attention_shape& shape, float* out, int64_t ldo,
                     attention_workspace& workspace) {
  const int head_dim = shape.head_dim;
  const int block_size = shape.block_size;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int64_t slot_floats = static_cast<int64_t>(shape.num_kv_heads) * head_dim;

  workspace.items.clear();
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int num_new = batch.query_start[s + 1] - batch.query_start[s];
    for (int first = 0; first < num_new; first += query_tile) {
      for (int h = 0; h < shape.num_heads; ++h) {
        workspace.items.push_back({s, h, first, std::min(query_tile, num_new - first)});
      }
    }
  }
  // Per thread: scores [tile, block_size], acc [tile, head_dim], running max and sum [tile].
  const size_t tile_floats = static_cast<size_t>(query_tile) * (block_size + head_dim + 2);
  if (workspace.per_thread.size() < tile_floats * pool.num_threads()) {
    workspace.per_thread.resize(tile_floats * pool.num_threads());
  }
  const row_kernels& kernels = active_kernels();
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // Tiny batches (short contexts, few heads) are cheaper on one thread than handed out.
  int64_t total_keys = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) total_keys += int64_t{batch.context_lengths[s]} * (batch.query_start[s + 1] - batch.query_start[s]);
  const int64_t num_items = static_cast<int64_t>(workspace.items.size());
  const int64_t chunk = total_keys * shape.num_heads * head_dim < 64 * 1024 ? num_items : 1;
  pool.parallel_for_dynamic(0, num_items, chunk,
                            [&](int64_t begin, int64_t end, int thread_index) {
    float* scores = workspace.per_thread.data() + tile_floats * thread_index;  // [tile, block_size]
    float* acc = scores + query_tile * block_size;                              // [tile, head_dim]
    float* running_max = acc + query_tile * head_dim;                           // [tile]
    float* running_sum = running_max + query_tile;                              // [tile]
    for (int64_t item_index = begin; item_index < end; ++item_index) {
      const attention_workspace::work_item item = workspace.items[item_index];
      const int num_new = batch.query_start[item.seq + 1] - batch.query_start[item.seq];
      const int context = batch.context_lengths[item.seq];
      const int* block_table = batch.block_tables.data() + batch.block_table_start[item.seq];
      const int64_t first_row = batch.query_start[item.seq] + item.first_query;
      const int nq = item.num_queries;
      // Query i of the tile sees context tokens 0 .. first_visible_end + i - 1.
      const int first_visible_end = context - num_new + item.first_query + 1;
      const int key_end = first_visible_end + nq - 1;
      const int64_t kv_offset = static_cast<int64_t>(item.head / group) * head_dim;
      const float* queries = q + first_row * ldq + static_cast<int64_t>(item.head) * head_dim;

      std::fill(acc, acc + nq * head_dim, 0.0f);
      std::fill(running_max, running_max + nq, neg_inf);
      std::fill(running_sum, running_sum + nq, 0.0f);
      for (int t0 = 0; t0 < key_end; t0 += block_size) {
        const int num_keys = std::min(block_size, key_end - t0);
        const int64_t base_slot = static_cast<int64_t>(block_table[t0 / block_size]) * block_size;
        const float* keys = key_pool + base_slot * slot_floats + kv_offset;
        const float* values = value_pool + base_slot * slot_floats + kv_offset;
        kernels.attention_scores(queries, nq, ldq, keys, num_keys, slot_floats, head_dim,
                                 shape.scale, scores);
        for (int i = 0; i < nq; ++i) {
          float* row = scores + i * num_keys;
          const int visible = std::clamp(first_visible_end + i - t0, 0, num_keys);
          float block_max = neg_inf;
          for (int t = 0; t < visible; ++t) block_max = std::max(block_max, row[t]);
          if (visible == 0) {
            std::fill(row, row + num_keys, 0.0f);
            continue;
          }
          const float new_max = std::max(running_max[i], block_max);
          const float correction = std::exp(running_max[i] - new_max);  // 0 on the first block
          if (correction != 1.0f) {
            for (int d = 0; d < head_dim; ++d) acc[i * head_dim + d] *= correction;
          }
          float sum = 0.0f;
          for (int t = 0; t < visible; ++t) {
            row[t] = std::exp(row[t] - new_max);
            sum += row[t];
          }
          std::fill(row + visible, row + num_keys, 0.0f);
          running_sum[i] = running_sum[i] * correction + sum;
          running_max[i] = new_max;
        }
        kernels.attention_values(scores, nq, num_keys, values, slot_floats, head_dim, acc,
                                 head_dim);
      }
      for (int i = 0; i < nq; ++i) {
        float* dst = out + (first_row + i) * ldo + static_cast<int64_t>(item.head) * head_dim;
        const float inv_sum = 1.0f / running_sum[i];
        for (int d = 0; d < head_dim; ++d) dst[d] = acc[i * head_dim + d] * inv_sum;
      }
    }
  });
}

}  // namespace troupe::cpu
