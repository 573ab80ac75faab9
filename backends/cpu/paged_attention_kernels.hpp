#pragma once
// The inner loops of CPU attention, one table per SIMD level (paged_attention_kernels_scalar.cpp,
// _avx2.cpp, _avx512.cpp over paged_attention_kernels_impl.hpp). paged_attention.cpp cuts a
// step's attention into pieces, hands them to these, and merges split pieces.
//
// A piece is the attention of some query rows of one sequence against one KV head over a range
// of its keys. Its rows are (new token i, query head g of the KV head's group) pairs in that
// order, row r = i * group + g, so one pass over a key serves every head of the group (GQA).
// Keys are read straight from the paged pool in its dtype and converted in registers.
//
// Two entry points compute a piece, with the same arithmetic per row:
// - `decode`: at most max_decode_rows rows (a decode token's group, a few speculative tokens),
//   in one block;
// - `tiled`: any number of rows, in blocks of half a register of rows (two keys dotted a round).
// A block reads its keys in tiles of 32 aligned to multiples of 32 from key 0. For each key, its
// K row is converted once and dotted with every row of the block; the dots of W (row, key) pairs
// are summed across lanes together by one addition tree that is the same for every pair; then an
// online softmax per row over the tile (base 2, exponentials vectorized) and P·V with each V row
// converted once. Nothing a row computes depends on the other rows of its block or piece.
//
// Bit invariance. A row's keys are taken in partitions of attention_partition_keys (aligned to
// multiples of it from key 0): each partition's softmax state starts fresh and is folded into
// the row's running state in key order (one fold function). A piece that spans partitions folds
// them as it goes; a long context split across threads (flash-decoding) computes a partition per
// piece and `merge` folds them in the same order. So a token's attention output has the same
// bits whether it was a decode step or a row of any prompt chunk, in any batch, on any number of
// threads: with invariant matrix products upstream, a 16-bit KV cache stores the same values for
// a prompt however it was cut (a re-run after a failover, a prefill/decode pair).
//
// Both produce the unnormalized state of the online softmax per row (max, sum, weighted sum of
// values) when asked. Soft-capping and the window's lower bound are applied to the scores inside;
// attention sinks, a term of the denominator only, are added where a row's softmax is finished
// (paged_attention.cpp).

#include <cstddef>
#include <cstdint>

#include "backends/cpu/simd_level.hpp"
#include "model/dtype.hpp"

namespace troupe::cpu {

// Keys per partition of a row's softmax (see above); pieces split across threads start and end
// on multiples of it.
constexpr int attention_partition_keys = 256;

struct attention_piece {
  const float* q = nullptr;  // token i, head g of the group at q + i * ldq + g * head_dim
  int64_t ldq = 0;
  int num_queries = 0;  // new tokens in the piece
  int group = 1;        // query heads per KV head
  int head_dim = 0;
  // The layer's pools, already offset to this KV head: key k's row (head_dim elements of
  // kv_type) is at keys + slot(k) * slot_bytes, slot(k) = block_table[k / block_size] *
  // block_size + k % block_size.
  const std::byte* keys = nullptr;
  const std::byte* values = nullptr;
  int64_t slot_bytes = 0;
  const int32_t* block_table = nullptr;
  int block_size = 0;
  int key_begin = 0;  // the keys this piece reads: [key_begin, key_end)
  int key_end = 0;
  int first_limit = 0;   // token i sees keys < first_limit + i (causality)
  int window = 0;        // > 0: token i sees only keys >= first_limit + i - window (sliding)
  float scale = 0.0f;    // softmax scale
  float softcap = 0.0f;  // > 0: scores (natural units) become softcap * tanh(score / softcap)
};

// Where a piece's result goes. Row r = (i, g) at acc + i * ld + g * head_dim, max[r], sum[r].
// `max` is in base 2 (log2 e folded into the scores); -inf with sum 0 for a row that saw no key.
// With `normalize`, acc is divided by sum at the end (the piece is the row's whole context).
struct attention_partial {
  float* acc = nullptr;  // [num_queries, ld], head_dim floats per row
  int64_t ld = 0;
  float* max = nullptr;  // [rows]
  float* sum = nullptr;  // [rows]
  bool normalize = false;
};

using attention_piece_fn = void (*)(const attention_piece& piece, const attention_partial& out, float* scratch);

// The split pieces of some rows, one partial per partition in key order, each partial_floats
// apart: acc [rows, head_dim], then max [rows], then sum [rows].
struct attention_merge {
  const float* partials = nullptr;
  size_t partial_floats = 0;
  int num_partials = 0;
  int rows = 0;  // row r = (token r / group, head r % group)
  int group = 1;
  int head_dim = 0;
  float* out = nullptr;  // row r at out + (r / group) * ldo + (r % group) * head_dim, normalized
  int64_t ldo = 0;
  float* max = nullptr;  // [rows] the rows' final max and sum (for attention sinks)
  float* sum = nullptr;
};
using attention_merge_fn = void (*)(const attention_merge& merge);
// f32 → the KV dtype and back, for `count` elements (whole q8_0 blocks): the pool's writes and
// exports. Same bytes as kv_encode_f32 / kv_decode_f32 (model/kv_transfer.hpp).
using kv_encode_fn = void (*)(const float* in, int64_t count, std::byte* out);
using kv_decode_fn = void (*)(const std::byte* in, int64_t count, float* out);

struct attention_kernels {
  // Indexed by the KV dtype (dtype as int); null for types that are not KV types.
  attention_piece_fn decode[num_dtypes];
  attention_piece_fn tiled[num_dtypes];
  kv_encode_fn encode[num_dtypes];
  kv_decode_fn decode_rows[num_dtypes];
  attention_merge_fn merge = nullptr;
  int max_decode_rows = 0;  // the decode kernel takes pieces of at most this many rows
  int tile_rows = 0;        // rows per tile of the tiled kernel (a piece should hold about this)
  // Floats of scratch one call of either kernel needs for this head_dim.
  size_t (*scratch_floats)(int head_dim) = nullptr;
};

const attention_kernels& scalar_attention_kernels();
const attention_kernels& avx2_attention_kernels();
const attention_kernels& avx512_attention_kernels();

// The table for `level` (active_simd_level() by default).
const attention_kernels& attention_kernels_for(simd_level level);
inline const attention_kernels& active_attention_kernels() { return attention_kernels_for(active_simd_level()); }

}  // namespace troupe::cpu
