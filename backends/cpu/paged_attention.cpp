#include "backends/cpu/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "backends/cpu/paged_attention_kernels.hpp"

namespace troupe::cpu {

namespace {

constexpr float log2_e = 1.4426950408889634f;  // the kernels' maxima are in base 2

// The first key a token at `position` sees: position - window + 1 in a window, else 0.
int first_visible_key(int position, int window) { return window > 0 ? std::max(0, position - window + 1) : 0; }

// What a finished row (normalized by its sum, of scores whose maximum is `max`, base 2) is
// multiplied by when a sink joins its denominator: sum / (sum + 2^(sink - max)), written so that
// neither exponential can overflow.
float sink_factor(float max, float sum, float sink) {
  if (sum <= 0.0f) return 0.0f;
  if (sink <= max) return sum / (sum + std::exp2(sink - max));
  const float scaled = sum * std::exp2(max - sink);
  return scaled / (scaled + 1.0f);
}

[[noreturn]] void bad_batch(const std::string& what) { throw std::runtime_error("forward_batch: " + what); }

}  // namespace

void check_attention_batch(const forward_batch& batch, const attention_params& shape) {
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
                " new tokens and context length " + std::to_string(context) + " (expected 0 <= new <= context)");
    }
    const int first = batch.block_table_start[s];
    const int last = batch.block_table_start[s + 1];
    const int needed = (context + shape.block_size - 1) / shape.block_size;
    if (first < 0 || last < first || last > static_cast<int>(batch.block_tables.size()) || last - first < needed) {
      bad_batch("sequence " + std::to_string(s) + " needs " + std::to_string(needed) + " blocks for context " +
                std::to_string(context) + ", its block table has " + std::to_string(last - first));
    }
    for (int b = first; b < first + needed; ++b) {
      if (batch.block_tables[b] < 0 || batch.block_tables[b] >= shape.num_blocks) {
        bad_batch("sequence " + std::to_string(s) + " uses block " + std::to_string(batch.block_tables[b]) +
                  ", outside the pool of " + std::to_string(shape.num_blocks) + " blocks");
      }
    }
  }
}

void paged_attention(thread_pool& pool, const float* q, int64_t ldq, const std::byte* key_pool,
                     const std::byte* value_pool, const forward_batch& batch, const attention_params& params,
                     float* out, int64_t ldo, attention_workspace& workspace) {
  const attention_kernels& kernels = active_attention_kernels();
  const int kv_index = static_cast<int>(params.kv_type);
  if (kernels.decode[kv_index] == nullptr) {
    throw std::runtime_error("paged_attention: KV dtype " + std::string(dtype_name(params.kv_type)) +
                             " has no attention kernel");
  }
  const int head_dim = params.head_dim;
  const int group = params.num_heads / params.num_kv_heads;
  const int64_t slot_bytes = static_cast<int64_t>(row_bytes(params.kv_type, int64_t{params.num_kv_heads} * head_dim));
  const int64_t head_bytes = static_cast<int64_t>(row_bytes(params.kv_type, head_dim));
  const int num_threads = pool.num_threads();
  auto decode_sized = [&](int num_queries) { return num_queries * group <= kernels.max_decode_rows; };

  // Pieces: per sequence, its new tokens in tiles (the last tile first: it reads the most keys),
  // each tile once per KV head.
  auto& pieces = workspace.pieces;
  auto& merges = workspace.merges;
  pieces.clear();
  merges.clear();
  int64_t total_work = 0;  // rows x keys, to tell a tiny step from a big one
  int max_rows = 1;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int num_new = batch.query_start[s + 1] - batch.query_start[s];
    if (num_new == 0) continue;
    const int context = batch.context_lengths[s];
    const int per_tile = decode_sized(num_new) ? num_new : std::max(1, kernels.tile_rows / group);
    const int num_tiles = (num_new + per_tile - 1) / per_tile;
    for (int t = num_tiles - 1; t >= 0; --t) {
      const int first = t * per_tile;
      const int count = std::min(per_tile, num_new - first);
      const int key_end = context - num_new + first + count;  // what the tile's last token sees
      const int key_begin = first_visible_key(context - num_new + first, params.window);  // its first token's first
      max_rows = std::max(max_rows, count * group);
      total_work += int64_t{count} * group * (key_end - key_begin) * params.num_kv_heads;
      for (int h = 0; h < params.num_kv_heads; ++h) pieces.push_back({s, h, first, count, key_begin, key_end, -1});
    }
  }
  if (pieces.empty()) return;

  // Too few pieces to keep every thread busy (a few long decodes): split their keys at the
  // partition boundaries, one partition a piece, folded back in key order by kernels.merge (the
  // same bits as a piece that spans them: paged_attention_kernels.hpp).
  const size_t wanted = static_cast<size_t>(4 * num_threads);
  constexpr int partition = attention_partition_keys;
  int num_partials = 0;
  size_t partial_floats = 0;
  if (num_threads > 1 && pieces.size() < wanted) {
    const size_t num_base = pieces.size();
    for (size_t b = 0; b < num_base; ++b) {
      const attention_workspace::piece_plan base = pieces[b];  // a copy: pieces grows below
      const int first_end = (base.key_begin / partition + 1) * partition;
      if (first_end >= base.key_end) continue;  // one partition: nothing to split
      attention_workspace::merge_plan merge{base.seq,         base.kv_head, base.first_query,
                                            base.num_queries, num_partials, 0};
      pieces[b].key_end = first_end;
      pieces[b].partial = num_partials++;
      for (int32_t begin = first_end; begin < base.key_end; begin += partition) {
        pieces.push_back({base.seq, base.kv_head, base.first_query, base.num_queries, begin,
                          std::min(begin + partition, base.key_end), num_partials++});
      }
      merge.num_splits = num_partials - merge.first_partial;
      merges.push_back(merge);
    }
    partial_floats = static_cast<size_t>(max_rows) * (head_dim + 2);
    if (workspace.partials.size() < partial_floats * num_partials)
      workspace.partials.resize(partial_floats * num_partials);
  }

  // Per thread: the kernels' scratch, then max and sum of the rows of a piece that writes out.
  const size_t scratch_floats = kernels.scratch_floats(head_dim) + 2 * static_cast<size_t>(max_rows);
  if (workspace.per_thread.size() < scratch_floats * num_threads)
    workspace.per_thread.resize(scratch_floats * num_threads);

  // A finished row's softmax gains its sink (if the model has them): rows r = (token r / group,
  // head r % group) at acc + (r / group) * ld + (r % group) * head_dim.
  auto add_sinks = [&](int kv_head, int rows, float* acc, int64_t ld, const float* max, const float* sum) {
    if (params.sinks == nullptr) return;
    for (int r = 0; r < rows; ++r) {
      const float sink = params.sinks[kv_head * group + r % group] * log2_e;
      float* dst = acc + (r / group) * ld + (r % group) * head_dim;
      const float keep = sink_factor(max[r], sum[r], sink);
      for (int d = 0; d < head_dim; ++d) dst[d] *= keep;
    }
  };

  auto run_piece = [&](const attention_workspace::piece_plan& plan, float* scratch) {
    const int num_new = batch.query_start[plan.seq + 1] - batch.query_start[plan.seq];
    const int64_t first_row = batch.query_start[plan.seq] + plan.first_query;
    const int64_t head_offset = static_cast<int64_t>(plan.kv_head) * group * head_dim;
    attention_piece piece;
    piece.q = q + first_row * ldq + head_offset;
    piece.ldq = ldq;
    piece.num_queries = plan.num_queries;
    piece.group = group;
    piece.head_dim = head_dim;
    piece.keys = key_pool + plan.kv_head * head_bytes;
    piece.values = value_pool + plan.kv_head * head_bytes;
    piece.slot_bytes = slot_bytes;
    piece.block_table = batch.block_tables.data() + batch.block_table_start[plan.seq];
    piece.block_size = params.block_size;
    piece.key_begin = plan.key_begin;
    piece.key_end = plan.key_end;
    piece.first_limit = batch.context_lengths[plan.seq] - num_new + plan.first_query + 1;
    piece.window = params.window;
    piece.scale = params.scale;
    piece.softcap = params.softcap;
    const int rows = plan.num_queries * group;
    attention_partial result;
    if (plan.partial < 0) {
      result.acc = out + first_row * ldo + head_offset;
      result.ld = ldo;
      result.max = scratch + kernels.scratch_floats(head_dim);
      result.sum = result.max + rows;
      result.normalize = true;
    } else {
      float* partial = workspace.partials.data() + plan.partial * partial_floats;  // acc [rows, head_dim], max, sum
      result.acc = partial;
      result.ld = static_cast<int64_t>(group) * head_dim;
      result.max = partial + static_cast<size_t>(rows) * head_dim;
      result.sum = result.max + rows;
    }
    const attention_piece_fn kernel =
        decode_sized(plan.num_queries) ? kernels.decode[kv_index] : kernels.tiled[kv_index];
    kernel(piece, result, scratch);
    if (plan.partial < 0) add_sinks(plan.kv_head, rows, result.acc, result.ld, result.max, result.sum);
  };

  // Small steps are cheaper on one thread than handed out: below this, a decode token's
  // attention takes ~20 µs on one core (a 256-token context at 16 heads of 64), about what
  // waking the other threads costs on a loaded machine.
  const int64_t num_pieces = static_cast<int64_t>(pieces.size());
  const int64_t chunk = total_work * head_dim < 256 * 1024 ? num_pieces : 1;
  pool.parallel_for_dynamic(0, num_pieces, chunk, [&](int64_t begin, int64_t end, int thread_index) {
    float* scratch = workspace.per_thread.data() + scratch_floats * thread_index;
    for (int64_t i = begin; i < end; ++i) run_piece(pieces[i], scratch);
  });
  if (merges.empty()) return;

  // Fold each split piece's partials in key order, then add the sinks as for a whole piece.
  pool.parallel_for(0, static_cast<int64_t>(merges.size()), 1, [&](int64_t begin, int64_t end, int thread_index) {
    float* scratch = workspace.per_thread.data() + scratch_floats * thread_index;
    for (int64_t m = begin; m < end; ++m) {
      const attention_workspace::merge_plan& plan = merges[m];
      attention_merge merge;
      merge.partials = workspace.partials.data() + plan.first_partial * partial_floats;
      merge.partial_floats = partial_floats;
      merge.num_partials = plan.num_splits;
      merge.rows = plan.num_queries * group;
      merge.group = group;
      merge.head_dim = head_dim;
      merge.out =
          out + (batch.query_start[plan.seq] + plan.first_query) * ldo + int64_t{plan.kv_head} * group * head_dim;
      merge.ldo = ldo;
      merge.max = scratch;
      merge.sum = scratch + max_rows;
      kernels.merge(merge);
      add_sinks(plan.kv_head, merge.rows, merge.out, ldo, merge.max, merge.sum);
    }
  });
}

}  // namespace troupe::cpu
