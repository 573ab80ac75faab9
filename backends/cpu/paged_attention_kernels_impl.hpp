#pragma once
// The attention kernels (paged_attention_kernels.hpp) written once over a SIMD "vector traits"
// type and instantiated by each paged_attention_kernels_<level>.cpp with its own compiler flags.
// Everything here has internal linkage (an anonymous namespace) and no std::vector / std::string,
// so the differently-compiled copies never meet at link time.
//
// A traits type V provides: reg, mask, width; zero(), set1(float), load(const float*),
// half_to_float(uint16_t) (one f16, in hardware where there is F16C),
// store(float*, reg); load_f16 / load_bf16 (const uint16_t*), load_i8 (const int8_t*),
// load_fp8 (const uint8_t*): `width` elements as f32; store_f16 / store_bf16 (uint16_t*),
// store_i8 (int8_t*, rounding to nearest even), store_fp8 (uint8_t*, as kv_encode_f32);
// add, sub, mul, div, max, abs, fma(a, b, c) = a * b + c; less(a, b) -> mask, select(mask, a, b) =
// mask ? a : b; exp2 (exact 0 below 2^-126, relative error ~1e-7 above); reduce_max
// (reg -> float); sum_halving (reg -> float: lane j + lane j + width/2 for j < width/2, and so on
// down to one lane); transpose(reg v[width]): in place, lane j of v[i] becomes lane i of v[j].

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/paged_attention_kernels.hpp"
#include "model/dtype.hpp"
#include "model/half_float.hpp"

namespace troupe::cpu {
namespace {

constexpr float log2_e = 1.4426950408889634f;
constexpr int key_tile = 32;  // keys per softmax tile, both kernels; divides a partition
static_assert(attention_partition_keys % key_tile == 0);

constexpr int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// ---- Reading and writing a KV row in each dtype ---------------------------------------------
// load(row, e): elements e .. e + width of the row as f32 (e a multiple of width);
// scalar(row, e): element e. For q8_0, width divides 32, so a load never straddles two blocks.

template <class V, dtype T>
struct kv_row;

template <class V>
struct kv_row<V, dtype::f32> {
  static typename V::reg load(const std::byte* row, int e) { return V::load(reinterpret_cast<const float*>(row) + e); }
  static float scalar(const std::byte* row, int e) {
    float value;
    std::memcpy(&value, row + 4 * e, 4);
    return value;
  }
};

template <class V>
struct kv_row<V, dtype::f16> {
  static typename V::reg load(const std::byte* row, int e) {
    return V::load_f16(reinterpret_cast<const uint16_t*>(row) + e);
  }
  static float scalar(const std::byte* row, int e) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * e, 2);
    return f16_to_f32(bits);
  }
};

template <class V>
struct kv_row<V, dtype::bf16> {
  static typename V::reg load(const std::byte* row, int e) {
    return V::load_bf16(reinterpret_cast<const uint16_t*>(row) + e);
  }
  static float scalar(const std::byte* row, int e) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * e, 2);
    return bf16_to_f32(bits);
  }
};

template <class V>
struct kv_row<V, dtype::fp8_e4m3> {
  static typename V::reg load(const std::byte* row, int e) {
    return V::load_fp8(reinterpret_cast<const uint8_t*>(row) + e);
  }
  static float scalar(const std::byte* row, int e) {
    uint8_t bits[V::width > 1 ? V::width : 1] = {};
    bits[0] = static_cast<uint8_t>(row[e]);
    float lanes[V::width];
    V::store(lanes, V::load_fp8(bits));
    return lanes[0];
  }
};

template <class V>
struct kv_row<V, dtype::q8_0> {
  static float block_scale(const std::byte* row, int e) {
    uint16_t bits;
    std::memcpy(&bits, row + (e / q8_0_block_size) * q8_0_block_bytes, 2);
    return V::half_to_float(bits);
  }
  static const int8_t* quants(const std::byte* row, int e) {
    return reinterpret_cast<const int8_t*>(row + (e / q8_0_block_size) * q8_0_block_bytes + 2) + e % q8_0_block_size;
  }
  static typename V::reg load(const std::byte* row, int e) {
    return V::mul(V::load_i8(quants(row, e)), V::set1(block_scale(row, e)));
  }
  static float scalar(const std::byte* row, int e) { return block_scale(row, e) * static_cast<float>(*quants(row, e)); }
};

// A row of `count` elements of T → f32 (count: whole q8_0 blocks for q8_0).
template <class V, dtype T>
void decode_kv_row(const std::byte* in, int64_t count, float* out) {
  int64_t e = 0;
  for (; e + V::width <= count; e += V::width) V::store(out + e, kv_row<V, T>::load(in, static_cast<int>(e)));
  for (; e < count; ++e) out[e] = kv_row<V, T>::scalar(in, static_cast<int>(e));
}

template <class V, dtype T>
void encode_kv_row(const float* in, int64_t count, std::byte* out) {
  constexpr int64_t W = V::width;
  int64_t e = 0;
  if constexpr (T == dtype::f32) {
    std::memcpy(out, in, static_cast<size_t>(count) * 4);
  } else if constexpr (T == dtype::f16 || T == dtype::bf16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(out);
    for (; e + W <= count; e += W) {
      if constexpr (T == dtype::f16)
        V::store_f16(dst + e, V::load(in + e));
      else
        V::store_bf16(dst + e, V::load(in + e));
    }
    for (; e < count; ++e) {
      const uint16_t bits = T == dtype::f16 ? f32_to_f16(in[e]) : f32_to_bf16(in[e]);
      std::memcpy(dst + e, &bits, 2);
    }
  } else if constexpr (T == dtype::fp8_e4m3) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(out);
    for (; e + W <= count; e += W) V::store_fp8(dst + e, V::load(in + e));
    for (; e < count; ++e) {  // the tail through a padded register
      float lanes[W] = {};
      uint8_t codes[W];
      lanes[0] = in[e];
      V::store_fp8(codes, V::load(lanes));
      dst[e] = codes[0];
    }
  } else {  // q8_0: d = max|x| / 127 per block of 32, q = x / d to nearest even, d stored as f16
    for (int64_t b = 0; b < count / q8_0_block_size; ++b) {
      const float* x = in + b * q8_0_block_size;
      std::byte* block = out + b * q8_0_block_bytes;
      typename V::reg amax = V::zero();
      for (int64_t i = 0; i < q8_0_block_size; i += W) amax = V::max(amax, V::abs(V::load(x + i)));
      const float d = V::reduce_max(amax) / 127.0f;
      const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t scale = f32_to_f16(d);
      std::memcpy(block, &scale, 2);
      int8_t* qs = reinterpret_cast<int8_t*>(block + 2);
      for (int64_t i = 0; i < q8_0_block_size; i += W) V::store_i8(qs + i, V::mul(V::load(x + i), V::set1(inverse)));
    }
  }
}

// Finds keys' rows through the block table: one division per run of keys, not one per key.
struct key_cursor {
  const int32_t* block_table;
  int block_size;
  int64_t slot_bytes;
  // offsets[j] = byte offset of key k0 + j's row, for j < n.
  void row_offsets(int k0, int n, int64_t* offsets) const {
    int block = k0 / block_size, within = k0 % block_size;
    int64_t base = static_cast<int64_t>(block_table[block]) * block_size * slot_bytes;
    for (int j = 0; j < n; ++j) {
      offsets[j] = base + within * slot_bytes;
      if (++within == block_size && j + 1 < n) {  // never reads past the run's last block
        within = 0;
        base = static_cast<int64_t>(block_table[++block]) * block_size * slot_bytes;
      }
    }
  }
};

// Gemma 2's soft-capping of `count` scores (a multiple of width) in the kernels' base-2 units:
// s = x log2 e for a natural score x, and cap (log2 e) tanh(x / cap) = C tanh(s / C) with
// C = cap log2 e. tanh(y) = 1 - 2 / (e^2y + 1), y clamped to +-9 (where tanh is +-1 in f32) so
// that exp2 stays finite; its absolute error (~1e-7) times the cap is far below the scores' own
// f32 rounding.
template <class V>
inline void soft_cap_scores(float* s, int count, float cap) {
  using reg = typename V::reg;
  const float c = cap * log2_e;
  const reg to_exponent = V::set1(2.0f * log2_e / c);  // s -> 2y log2 e
  const reg lo = V::set1(-18.0f * log2_e), hi = V::set1(18.0f * log2_e);
  const reg one = V::set1(1.0f), two = V::set1(2.0f), big = V::set1(c);
  for (int j = 0; j < count; j += static_cast<int>(V::width)) {
    reg e = V::mul(V::load(s + j), to_exponent);
    e = V::max(e, lo);
    e = V::select(V::less(hi, e), hi, e);
    const reg t = V::sub(one, V::div(two, V::add(V::exp2(e), one)));
    V::store(s + j, V::mul(big, t));
  }
}

// Into L2 (prefetcht1): a tile's keys and values are 128 lines at head_dim 64 in f16, asked for
// in bursts. Prefetched into L1 they wait on its few miss buffers and stall the loads behind them:
// 1.6-1.75x slower at 16k and 32k keys on one thread (troupe_bench_attention), and fetching two
// tiles ahead instead of one gains nothing more.
inline void prefetch_row(const std::byte* row, int bytes) {
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
}

// ---- The arithmetic every path shares -------------------------------------------------------
// Bit invariance (paged_attention_kernels.hpp) needs each quantity computed by the same
// operations in the same order on every path:
// - a score is q·k summed over d = 0 .. head_dim - 1 in order, one FMA per element, from 0
//   (the decode kernel with keys across lanes, the tiled one with rows across lanes);
// - a tile's sum of exponentials is tile_sum's halving tree;
// - the weighted sum of values is acc · correction, then one FMA per key in order;
// - partitions are folded by fold_softmax_state's formula (or its across-rows twin in the tiled
//   kernel, the same operations per lane).
// This file is compiled with -ffp-contract=off, so no multiply-add is fused in one place and not
// in another.

template <class V>
inline float exp2_scalar(float x) {
  float lanes[V::width];
  V::store(lanes, V::exp2(V::set1(x)));
  return lanes[0];
}

template <class V>
inline float fma_scalar(float a, float b, float c) {
  float lanes[V::width];
  V::store(lanes, V::fma(V::set1(a), V::set1(b), V::set1(c)));
  return lanes[0];
}

// The weights that fold a state of max m into one of max M: (new max, keep, add); both 0 when
// neither has seen a key (max -inf).
inline float folded_max_of(float M, float m) { return M > m ? M : m; }

// (max, sum, acc[hd]) ← (max, sum, acc) · keep + (m, l, a[hd]) · add, where the new max is the
// larger and keep, add rescale each side to it. Every state starts at (-inf, 0, zeros).
template <class V>
inline void fold_softmax_state(float& max, float& sum, float* acc, float m, float l, const float* a, int hd) {
  constexpr int W = static_cast<int>(V::width);
  const float new_max = folded_max_of(max, m);
  const bool empty = new_max == -std::numeric_limits<float>::infinity();
  const float keep = empty ? 0.0f : exp2_scalar<V>(max - new_max);
  const float add = empty ? 0.0f : exp2_scalar<V>(m - new_max);
  sum = sum * keep + l * add;
  max = new_max;
  int d = 0;
  for (; d + W <= hd; d += W) {
    V::store(acc + d, V::fma(V::load(a + d), V::set1(add), V::mul(V::load(acc + d), V::set1(keep))));
  }
  for (; d < hd; ++d) acc[d] = fma_scalar<V>(a[d], add, acc[d] * keep);
}

// A finished row: acc / sum (0 for a row that saw no key).
inline float inverse_of(float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; }

// A tile's sum of exponentials, by halving: x[j] + x[j + 16] for j < 16, then + 8, + 4, + 2, + 1
// (the decode kernel's W-lane registers do the first levels, sum_halving the rest; the tiled
// kernel the same levels with rows across lanes). `s` [key_tile] stays as it is; `halves`
// [key_tile / 2] is scratch.
template <class V>
inline float tile_sum(const float* s, float* halves) {
  constexpr int W = static_cast<int>(V::width);
  constexpr int half = key_tile / 2;
  for (int j = 0; j < half; j += W) V::store(halves + j, V::add(V::load(s + j), V::load(s + j + half)));
  for (int h = half / 2; h >= W; h /= 2)
    for (int j = 0; j < h; j += W) V::store(halves + j, V::add(V::load(halves + j), V::load(halves + j + h)));
  return V::sum_halving(V::load(halves));
}

// ---- The decode kernel ----------------------------------------------------------------------
// Up to max_decode_rows rows (padded to RP, a power of two). Per tile: the keys are converted
// and transposed once (kt, dimension-major), then each row's 32 scores are accumulated with the
// keys across lanes, one dimension at a time; the softmax runs per row across the tile's keys;
// P·V per row across dimensions, each V register converted once.

// Rows whose scores one pass keeps in registers: a power of two dividing RP, RC * G accumulators
// beside G key registers and a broadcast query.
constexpr int score_pass_rows(int rp, int g, int registers) {
  int rows = 1;
  while (rows * 2 <= rp && rows * 2 * g + g + 1 <= registers) rows *= 2;
  return rows;
}

template <class V>
constexpr int decode_rows_max() {
  return V::width > 1 ? static_cast<int>(V::width) : 8;
}

template <class V>
size_t decode_scratch_floats(int head_dim) {
  const size_t hdp = round_up(head_dim, static_cast<int>(V::width));
  const size_t rows = decode_rows_max<V>();
  // queries [rows, hdp], probabilities [rows, key_tile], padded rows' acc [hdp],
  // keys transposed [hdp, key_tile], folded acc [rows, hdp]
  return rows * hdp + rows * key_tile + hdp + hdp * key_tile + rows * hdp;
}

template <class V, dtype T, int RP>
void decode_piece_rows(const attention_piece& p, const attention_partial& out, float* scratch) {
  using reg = typename V::reg;
  using row = kv_row<V, T>;
  constexpr int W = static_cast<int>(V::width);
  constexpr int G = key_tile / W;  // registers of a row's scores
  constexpr int registers = V::width >= 16 ? 32 : 16;
  constexpr int RC = score_pass_rows(RP, G, registers);  // rows per score pass
  constexpr int CH = 2 * RP + 3 <= registers ? 2 : 1;    // value registers per pass of P·V
  constexpr int P = attention_partition_keys;
  const int rows = p.num_queries * p.group;
  const int hd = p.head_dim;
  const int hdp = round_up(hd, W);
  const int full = hd / W * W;  // elements in whole registers; the rest go one at a time
  const int head_bytes = static_cast<int>(row_bytes(T, hd));

  float* qs = scratch;                      // [RP, hdp] queries * scale * log2 e; padded rows 0
  float* probs = qs + RP * hdp;             // [RP, key_tile] scores, then probabilities
  float* spare = probs + RP * key_tile;     // [hdp] the accumulator of padded rows (discarded)
  float* kt = spare + hdp;                  // [hd, key_tile] the tile's keys, dimension-major
  float* folded_acc = kt + hdp * key_tile;  // [RP, hdp] the partitions before the current one

  float* acc[RP];  // each row's weighted sum of values over the current partition, [hd]
  float limit[RP], running_max[RP], running_sum[RP], correction[RP], folded_max[RP], folded_sum[RP];
  int lower[RP];  // the first key each row sees: its window's, never one before the piece's
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < RP; ++r) {
    const bool real = r < rows;
    const int i = r / p.group, g = r % p.group;
    const float* src = real ? p.q + i * p.ldq + static_cast<int64_t>(g) * hd : nullptr;
    for (int d = 0; d < hdp; ++d) qs[r * hdp + d] = real && d < hd ? src[d] * p.scale * log2_e : 0.0f;
    acc[r] = real ? out.acc + i * out.ld + static_cast<int64_t>(g) * hd : spare;
    for (int d = 0; d < hd; ++d) acc[r][d] = 0.0f;
    for (int d = 0; d < hd; ++d) folded_acc[r * hdp + d] = 0.0f;
    limit[r] = real ? static_cast<float>(p.first_limit + i) : 0.0f;
    const int window_first = real && p.window > 0 ? p.first_limit + i - p.window : 0;
    lower[r] = window_first > p.key_begin ? window_first : p.key_begin;
    running_max[r] = folded_max[r] = neg_inf;
    running_sum[r] = folded_sum[r] = 0.0f;
  }
  // Ends the current partition: its state joins the folded one and the next starts fresh.
  auto fold_partition = [&] {
    for (int r = 0; r < rows; ++r) {
      fold_softmax_state<V>(folded_max[r], folded_sum[r], folded_acc + r * hdp, running_max[r], running_sum[r], acc[r],
                            hd);
      for (int d = 0; d < hd; ++d) acc[r][d] = 0.0f;
      running_max[r] = neg_inf;
      running_sum[r] = 0.0f;
    }
  };

  // Tiles start on multiples of key_tile; keys of the first one before the piece's first are
  // masked for every row and never read (they may lie in a block a sliding window gave back):
  // their rows point at the first key's.
  const key_cursor cursor{p.block_table, p.block_size, p.slot_bytes};
  const int key_start = p.key_begin / key_tile * key_tile;
  auto tile_offsets = [&](int k0, int n, int64_t* offsets) {
    const int skip = p.key_begin > k0 ? p.key_begin - k0 : 0;
    cursor.row_offsets(k0 + skip, n - skip, offsets + skip);
    for (int j = 0; j < skip; ++j) offsets[j] = offsets[skip];
  };
  const std::byte* key_rows[key_tile];
  const std::byte* value_rows[key_tile];
  int64_t offsets[2][key_tile];  // this tile's rows and the next one's
  int current = 0;
  if (key_start < p.key_end) {
    tile_offsets(key_start, p.key_end - key_start < key_tile ? p.key_end - key_start : key_tile, offsets[0]);
  }
  int partition_end = (key_start / P + 1) * P;
  for (int k0 = key_start; k0 < p.key_end; k0 += key_tile) {
    if (k0 == partition_end) {
      fold_partition();
      partition_end += P;
    }
    const int n = p.key_end - k0 < key_tile ? p.key_end - k0 : key_tile;
    for (int j = 0; j < key_tile; ++j) {  // past n: the last key again (masked)
      key_rows[j] = p.keys + offsets[current][j < n ? j : n - 1];
      value_rows[j] = p.values + offsets[current][j < n ? j : n - 1];
    }
    // The next tile's rows are fetched while this one computes (the block table's jumps defeat
    // the hardware prefetcher at every block boundary; measured at 32k keys: 2-3x).
    const int next_n = p.key_end - (k0 + key_tile) < key_tile ? p.key_end - (k0 + key_tile) : key_tile;
    if (next_n > 0) cursor.row_offsets(k0 + key_tile, next_n, offsets[1 - current]);
    current = 1 - current;

    // kt: the tile's keys transposed, W keys by W dimensions a register block. The next tile's
    // rows are prefetched a few keys a block (offsets[current] holds the next tile's now).
    const int num_blocks = (key_tile / W) * (full / W);
    const int per_block = num_blocks > 0 ? (next_n + num_blocks - 1) / num_blocks : next_n;
    int prefetched = 0;
    auto prefetch_some = [&] {
      for (int end = prefetched + per_block < next_n ? prefetched + per_block : next_n; prefetched < end;
           ++prefetched) {
        prefetch_row(p.keys + offsets[current][prefetched], head_bytes);
        prefetch_row(p.values + offsets[current][prefetched], head_bytes);
      }
    };
    if (num_blocks == 0) prefetch_some();
    for (int j0 = 0; j0 < key_tile; j0 += W) {
      for (int d0 = 0; d0 < full; d0 += W) {
        prefetch_some();
        reg block[W];
        for (int j = 0; j < W; ++j) block[j] = row::load(key_rows[j0 + j], d0);
        V::transpose(block);
        for (int e = 0; e < W; ++e) V::store(kt + (d0 + e) * key_tile + j0, block[e]);
      }
      for (int d = full; d < hd; ++d)
        for (int j = 0; j < W; ++j) kt[d * key_tile + j0 + j] = row::scalar(key_rows[j0 + j], d);
    }

    // Scores: RC rows a pass, each row's key_tile scores in G registers, one dimension a step.
    for (int r0 = 0; r0 < RP; r0 += RC) {
      reg s[RC][G];
      for (int r = 0; r < RC; ++r)
        for (int g = 0; g < G; ++g) s[r][g] = V::zero();
      for (int d = 0; d < hd; ++d) {
        reg k[G];
        for (int g = 0; g < G; ++g) k[g] = V::load(kt + d * key_tile + g * W);
        for (int r = 0; r < RC; ++r) {
          const reg q = V::set1(qs[(r0 + r) * hdp + d]);
          for (int g = 0; g < G; ++g) s[r][g] = V::fma(q, k[g], s[r][g]);
        }
      }
      for (int r = 0; r < RC; ++r)
        for (int g = 0; g < G; ++g) V::store(probs + (r0 + r) * key_tile + g * W, s[r][g]);
    }

    // Online softmax per row over this tile (masked keys and the tile's tail are -inf): keys
    // hidden .. visible of the tile are the row's.
    float halves[key_tile / 2];
    for (int r = 0; r < RP; ++r) {
      float* s = probs + r * key_tile;
      if (p.softcap > 0.0f) soft_cap_scores<V>(s, key_tile, p.softcap);
      int visible = static_cast<int>(limit[r]) - k0;
      visible = visible < 0 ? 0 : (visible > n ? n : visible);
      int hidden = lower[r] - k0;
      hidden = hidden < 0 ? 0 : (hidden > visible ? visible : hidden);
      if (visible == hidden) {  // nothing of this tile: the row's state stays as it is
        for (int j = 0; j < key_tile; ++j) s[j] = 0.0f;
        correction[r] = 1.0f;
        continue;
      }
      for (int j = 0; j < hidden; ++j) s[j] = neg_inf;
      for (int j = visible; j < key_tile; ++j) s[j] = neg_inf;
      reg tile_max = V::set1(neg_inf);
      for (int j = 0; j < key_tile; j += W) tile_max = V::max(tile_max, V::load(s + j));
      const float new_max = folded_max_of(running_max[r], V::reduce_max(tile_max));
      const reg shift = V::set1(new_max);
      for (int j = 0; j < key_tile; j += W) V::store(s + j, V::exp2(V::sub(V::load(s + j), shift)));
      const float total = tile_sum<V>(s, halves);
      correction[r] = exp2_scalar<V>(running_max[r] - new_max);  // 0 on the partition's first visible tile
      running_sum[r] = running_sum[r] * correction[r] + total;
      running_max[r] = new_max;
    }

    // acc = acc * correction + P · V, each V register converted once; CH registers of each
    // row at a time, so that a broadcast probability serves CH products.
    int d = 0;
    for (; d + CH * W <= full; d += CH * W) {
      reg a[RP][CH];
      for (int r = 0; r < RP; ++r)
        for (int c = 0; c < CH; ++c) a[r][c] = V::mul(V::load(acc[r] + d + c * W), V::set1(correction[r]));
      for (int j = 0; j < n; ++j) {
        reg v[CH];
        for (int c = 0; c < CH; ++c) v[c] = row::load(value_rows[j], d + c * W);
        for (int r = 0; r < RP; ++r) {
          const reg prob = V::set1(probs[r * key_tile + j]);
          for (int c = 0; c < CH; ++c) a[r][c] = V::fma(prob, v[c], a[r][c]);
        }
      }
      for (int r = 0; r < RP; ++r)
        for (int c = 0; c < CH; ++c) V::store(acc[r] + d + c * W, a[r][c]);
    }
    for (; d < full; d += W) {
      reg a[RP];
      for (int r = 0; r < RP; ++r) a[r] = V::mul(V::load(acc[r] + d), V::set1(correction[r]));
      for (int j = 0; j < n; ++j) {
        const reg v = row::load(value_rows[j], d);
        for (int r = 0; r < RP; ++r) a[r] = V::fma(V::set1(probs[r * key_tile + j]), v, a[r]);
      }
      for (int r = 0; r < RP; ++r) V::store(acc[r] + d, a[r]);
    }
    for (; d < hd; ++d) {
      for (int r = 0; r < RP; ++r) {
        float a = acc[r][d] * correction[r];
        for (int j = 0; j < n; ++j) a = fma_scalar<V>(probs[r * key_tile + j], row::scalar(value_rows[j], d), a);
        acc[r][d] = a;
      }
    }
  }

  fold_partition();  // the last partition; the folded state is the rows' result
  for (int r = 0; r < rows; ++r) {
    out.max[r] = folded_max[r];
    out.sum[r] = folded_sum[r];
    const float scale = out.normalize ? inverse_of(folded_sum[r]) : 1.0f;
    for (int d = 0; d < hd; ++d) acc[r][d] = folded_acc[r * hdp + d] * scale;
  }
}

template <class V, dtype T>
void decode_piece(const attention_piece& p, const attention_partial& out, float* scratch) {
  const int rows = p.num_queries * p.group;
  if (rows <= 1) return decode_piece_rows<V, T, 1>(p, out, scratch);
  if (rows <= 2) return decode_piece_rows<V, T, 2>(p, out, scratch);
  if (rows <= 4) return decode_piece_rows<V, T, 4>(p, out, scratch);
  if constexpr (V::width >= 8 || V::width == 1) {
    if (rows <= 8) return decode_piece_rows<V, T, 8>(p, out, scratch);
  }
  if constexpr (V::width >= 16) {
    if (rows <= 16) return decode_piece_rows<V, T, 16>(p, out, scratch);
  }
}

// ---- The tiled kernel -----------------------------------------------------------------------
// Rows padded to a multiple of RB registers; S and O kept transposed (key or dimension major,
// rows minor) so the softmax and the rescale run across rows, and both products broadcast one
// K or V element against RB registers of rows.

template <class V>
constexpr int tile_row_count() {
  return V::width > 1 ? 4 * static_cast<int>(V::width) : 8;
}
template <class V>
constexpr int keys_per_block() {
  return V::width >= 16 ? 8 : 4;
}
constexpr int row_registers = 2;  // RB

template <class V>
size_t tiled_scratch_floats(int head_dim) {
  const size_t rt = tile_row_count<V>();
  // qt, ot, folded ot [head_dim, rt]; kf, vf [key_tile, head_dim]; st [key_tile, rt];
  // m, l, corr, limit, lower, folded m and l [rt]
  return 3 * head_dim * rt + 2 * static_cast<size_t>(key_tile) * head_dim + key_tile * rt + 7 * rt;
}

// st[k][rows] = Σ_d kf[k][d] · qt[d][rows] for NK keys and RB registers of rows.
template <class V, int NK>
inline void scores_block(const float* qt, int ldq, const float* kf, int hd, float* st, int lds) {
  using reg = typename V::reg;
  constexpr int W = static_cast<int>(V::width);
  reg acc[row_registers][NK];
  for (int b = 0; b < row_registers; ++b)
    for (int k = 0; k < NK; ++k) acc[b][k] = V::zero();
  for (int d = 0; d < hd; ++d) {
    reg q[row_registers];
    for (int b = 0; b < row_registers; ++b) q[b] = V::load(qt + d * ldq + b * W);
    for (int k = 0; k < NK; ++k) {
      const reg kb = V::set1(kf[k * hd + d]);
      for (int b = 0; b < row_registers; ++b) acc[b][k] = V::fma(q[b], kb, acc[b][k]);
    }
  }
  for (int k = 0; k < NK; ++k)
    for (int b = 0; b < row_registers; ++b) V::store(st + k * lds + b * W, acc[b][k]);
}

// ot[d][rows] = ot[d][rows] * corr[rows] + Σ_k vf[k][d] · pt[k][rows] for ND dimensions.
template <class V, int ND>
inline void values_block(const float* pt, int ldp, int num_keys, const float* vf, int hd, float* ot, int ldo,
                         const float* corr) {
  using reg = typename V::reg;
  constexpr int W = static_cast<int>(V::width);
  reg acc[row_registers][ND];
  reg c[row_registers];
  for (int b = 0; b < row_registers; ++b) c[b] = V::load(corr + b * W);
  for (int dd = 0; dd < ND; ++dd)
    for (int b = 0; b < row_registers; ++b) acc[b][dd] = V::mul(V::load(ot + dd * ldo + b * W), c[b]);
  for (int k = 0; k < num_keys; ++k) {
    reg pr[row_registers];
    for (int b = 0; b < row_registers; ++b) pr[b] = V::load(pt + k * ldp + b * W);
    for (int dd = 0; dd < ND; ++dd) {
      const reg vb = V::set1(vf[k * hd + dd]);
      for (int b = 0; b < row_registers; ++b) acc[b][dd] = V::fma(pr[b], vb, acc[b][dd]);
    }
  }
  for (int dd = 0; dd < ND; ++dd)
    for (int b = 0; b < row_registers; ++b) V::store(ot + dd * ldo + b * W, acc[b][dd]);
}

// fold_softmax_state for W rows at once (lanes are rows; acc [hd] of them ld apart): the same
// operations per lane.
template <class V>
inline void fold_softmax_states(float* max, float* sum, float* acc, const float* m, const float* l, float* a, int hd,
                                int ld) {
  using reg = typename V::reg;
  const reg old_max = V::load(max), part_max = V::load(m);
  const reg new_max = V::max(old_max, part_max);
  const auto empty = V::less(new_max, V::set1(std::numeric_limits<float>::lowest()));
  const reg keep = V::select(empty, V::zero(), V::exp2(V::sub(old_max, new_max)));
  const reg add = V::select(empty, V::zero(), V::exp2(V::sub(part_max, new_max)));
  V::store(sum, V::add(V::mul(V::load(sum), keep), V::mul(V::load(l), add)));
  V::store(max, new_max);
  for (int d = 0; d < hd; ++d)
    V::store(acc + d * ld, V::fma(V::load(a + d * ld), add, V::mul(V::load(acc + d * ld), keep)));
}

template <class V, dtype T>
void tiled_piece(const attention_piece& p, const attention_partial& out, float* scratch) {
  using reg = typename V::reg;
  constexpr int W = static_cast<int>(V::width);
  constexpr int RT = tile_row_count<V>();
  constexpr int NK = keys_per_block<V>();
  constexpr int ND = 8;
  constexpr int P = attention_partition_keys;
  constexpr int step = row_registers * W;
  const int hd = p.head_dim;
  const int total_rows = p.num_queries * p.group;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  float* qt = scratch;                      // [hd, RT] queries * scale * log2 e, transposed
  float* ot = qt + hd * RT;                 // [hd, RT] weighted sums of values over the current partition, transposed
  float* folded_ot = ot + hd * RT;          // [hd, RT] the partitions before the current one
  float* kf = folded_ot + hd * RT;          // [key_tile, hd] the tile's keys as f32
  float* vf = kf + key_tile * hd;           // [key_tile, hd] the tile's values as f32
  float* st = vf + key_tile * hd;           // [key_tile, RT] scores, then probabilities
  float* running_max = st + key_tile * RT;  // [RT]
  float* running_sum = running_max + RT;    // [RT]
  float* correction = running_sum + RT;     // [RT]
  float* limit = correction + RT;           // [RT] keys < limit are visible (as float: exact below 2^24)
  float* lower = limit + RT;                // [RT] and keys >= lower (a window's first key, never before the piece's)
  float* folded_max = lower + RT;           // [RT]
  float* folded_sum = folded_max + RT;      // [RT]

  const key_cursor cursor{p.block_table, p.block_size, p.slot_bytes};
  for (int r0 = 0; r0 < total_rows; r0 += RT) {
    const int rt = total_rows - r0 < RT ? total_rows - r0 : RT;
    const int rtp = round_up(rt, step);
    for (int r = 0; r < rtp; ++r) {
      const bool real = r < rt;
      const int i = (r0 + r) / p.group, g = (r0 + r) % p.group;
      const float* src = real ? p.q + i * p.ldq + static_cast<int64_t>(g) * hd : nullptr;
      for (int d = 0; d < hd; ++d) qt[d * rtp + r] = real ? src[d] * p.scale * log2_e : 0.0f;
      limit[r] = real ? static_cast<float>(p.first_limit + i) : 0.0f;
      const int window_first = real && p.window > 0 ? p.first_limit + i - p.window : 0;
      lower[r] = static_cast<float>(window_first > p.key_begin ? window_first : p.key_begin);
      running_max[r] = folded_max[r] = neg_inf;
      running_sum[r] = folded_sum[r] = 0.0f;
    }
    for (int e = 0; e < hd * rtp; ++e) ot[e] = folded_ot[e] = 0.0f;
    auto fold_partition = [&] {
      for (int b = 0; b < rtp; b += W) {
        fold_softmax_states<V>(folded_max + b, folded_sum + b, folded_ot + b, running_max + b, running_sum + b, ot + b,
                               hd, rtp);
      }
      for (int r = 0; r < rtp; ++r) {
        running_max[r] = neg_inf;
        running_sum[r] = 0.0f;
      }
      for (int e = 0; e < hd * rtp; ++e) ot[e] = 0.0f;
    };
    const int min_limit = static_cast<int>(limit[0]);
    const int max_limit = static_cast<int>(limit[rt - 1]);
    const int key_end = p.key_end < max_limit ? p.key_end : max_limit;
    // Keys before the first row's first are no row's; keys before the last row's first are
    // hidden from some row. Tiles start on multiples of key_tile: keys of the first one before
    // the piece's first are zeros, masked, never read (a sliding window may have given them back).
    const int max_lower = static_cast<int>(lower[rt - 1]);
    const int key_start = static_cast<int>(lower[0]) / key_tile * key_tile;
    int partition_end = (key_start / P + 1) * P;

    for (int k0 = key_start; k0 < key_end; k0 += key_tile) {
      if (k0 == partition_end) {
        fold_partition();
        partition_end += P;
      }
      const int n = key_end - k0 < key_tile ? key_end - k0 : key_tile;
      const int np = round_up(n, NK);
      const int skip = p.key_begin > k0 ? p.key_begin - k0 : 0;
      int64_t offsets[key_tile];
      cursor.row_offsets(k0 + skip, n - skip, offsets + skip);
      for (int j = skip; j < n; ++j) {
        decode_kv_row<V, T>(p.keys + offsets[j], hd, kf + j * hd);
        decode_kv_row<V, T>(p.values + offsets[j], hd, vf + j * hd);
      }
      for (int e = 0; e < skip * hd; ++e) kf[e] = vf[e] = 0.0f;
      for (int e = n * hd; e < np * hd; ++e) kf[e] = vf[e] = 0.0f;

      for (int j = 0; j < np; j += NK)
        for (int b = 0; b < rtp; b += step) scores_block<V, NK>(qt + b, rtp, kf + j * hd, hd, st + j * rtp + b, rtp);

      if (p.softcap > 0.0f) soft_cap_scores<V>(st, np * rtp, p.softcap);

      // Mask only where some row cannot see some key of the tile (the diagonal, the tail, the
      // window's start).
      if (k0 + n > min_limit || n < np) {
        for (int j = 0; j < np; ++j) {
          const reg key = V::set1(j < n ? static_cast<float>(k0 + j) : std::numeric_limits<float>::max());
          for (int b = 0; b < rtp; b += W) {
            const reg s = V::load(st + j * rtp + b);
            V::store(st + j * rtp + b, V::select(V::less(key, V::load(limit + b)), s, V::set1(neg_inf)));
          }
        }
      }
      if (k0 < max_lower) {
        for (int j = 0; j < n; ++j) {
          const reg key = V::set1(static_cast<float>(k0 + j));
          for (int b = 0; b < rtp; b += W) {
            const reg s = V::load(st + j * rtp + b);
            V::store(st + j * rtp + b, V::select(V::less(key, V::load(lower + b)), V::set1(neg_inf), s));
          }
        }
      }

      // Online softmax across rows, W rows a register.
      for (int b = 0; b < rtp; b += W) {
        const reg old_max = V::load(running_max + b);
        reg tile_max = V::set1(neg_inf);
        for (int j = 0; j < np; ++j) tile_max = V::max(tile_max, V::load(st + j * rtp + b));
        const reg new_max = V::max(old_max, tile_max);
        // A row that has seen nothing yet keeps -inf; shift it by 0 so that exp2 gives 0, not NaN.
        const reg shift =
            V::select(V::less(new_max, V::set1(std::numeric_limits<float>::lowest())), V::zero(), new_max);
        for (int j = 0; j < np; ++j) V::store(st + j * rtp + b, V::exp2(V::sub(V::load(st + j * rtp + b), shift)));
        // tile_sum's halving, rows across lanes (keys past np count 0).
        reg halves[key_tile / 2];
        for (int j = 0; j < key_tile / 2; ++j) {
          const reg low = j < np ? V::load(st + j * rtp + b) : V::zero();
          halves[j] =
              j + key_tile / 2 < np ? V::add(low, V::load(st + (j + key_tile / 2) * rtp + b)) : V::add(low, V::zero());
        }
        for (int h = key_tile / 4; h >= 1; h /= 2)
          for (int j = 0; j < h; ++j) halves[j] = V::add(halves[j], halves[j + h]);
        const reg total = halves[0];
        const reg corr = V::exp2(V::sub(old_max, shift));
        V::store(correction + b, corr);
        V::store(running_sum + b, V::add(V::mul(V::load(running_sum + b), corr), total));
        V::store(running_max + b, new_max);
      }

      int d = 0;
      for (; d + ND <= hd; d += ND)
        for (int b = 0; b < rtp; b += step)
          values_block<V, ND>(st + b, rtp, np, vf + d, hd, ot + d * rtp + b, rtp, correction + b);
      for (; d < hd; ++d)
        for (int b = 0; b < rtp; b += step)
          values_block<V, 1>(st + b, rtp, np, vf + d, hd, ot + d * rtp + b, rtp, correction + b);
    }
    fold_partition();  // the last partition; the folded state is the rows' result

    for (int r = 0; r < rt; ++r) {
      const int i = (r0 + r) / p.group, g = (r0 + r) % p.group;
      float* dst = out.acc + i * out.ld + static_cast<int64_t>(g) * hd;
      const float scale = out.normalize ? inverse_of(folded_sum[r]) : 1.0f;
      for (int e = 0; e < hd; ++e) dst[e] = folded_ot[e * rtp + r] * scale;
      out.max[r0 + r] = folded_max[r];
      out.sum[r0 + r] = folded_sum[r];
    }
  }
}

// Folds split pieces' partial states, in key order, into the rows' results (normalized).
template <class V>
void merge_partials(const attention_merge& m) {
  for (int r = 0; r < m.rows; ++r) {
    float* acc = m.out + (r / m.group) * m.ldo + static_cast<int64_t>(r % m.group) * m.head_dim;
    float max = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int d = 0; d < m.head_dim; ++d) acc[d] = 0.0f;
    for (int s = 0; s < m.num_partials; ++s) {
      const float* partial = m.partials + s * m.partial_floats;  // acc [rows, head_dim], max [rows], sum [rows]
      const float* part_max = partial + static_cast<size_t>(m.rows) * m.head_dim;
      fold_softmax_state<V>(max, sum, acc, part_max[r], part_max[m.rows + r],
                            partial + static_cast<size_t>(r) * m.head_dim, m.head_dim);
    }
    m.max[r] = max;
    m.sum[r] = sum;
    const float scale = inverse_of(sum);
    for (int d = 0; d < m.head_dim; ++d) acc[d] *= scale;
  }
}

template <class V>
size_t attention_scratch_floats(int head_dim) {
  const size_t a = decode_scratch_floats<V>(head_dim), b = tiled_scratch_floats<V>(head_dim);
  return a > b ? a : b;
}

template <class V, dtype T>
void fill_kv_type(attention_kernels& table) {
  const int index = static_cast<int>(T);
  table.decode[index] = &decode_piece<V, T>;
  table.tiled[index] = &tiled_piece<V, T>;
  table.encode[index] = &encode_kv_row<V, T>;
  table.decode_rows[index] = &decode_kv_row<V, T>;
}

template <class V>
attention_kernels make_attention_kernels() {
  attention_kernels table{};
  fill_kv_type<V, dtype::f32>(table);
  fill_kv_type<V, dtype::f16>(table);
  fill_kv_type<V, dtype::bf16>(table);
  fill_kv_type<V, dtype::q8_0>(table);
  fill_kv_type<V, dtype::fp8_e4m3>(table);
  table.merge = &merge_partials<V>;
  table.max_decode_rows = decode_rows_max<V>();
  table.tile_rows = tile_row_count<V>();
  table.scratch_floats = &attention_scratch_floats<V>;
  return table;
}

}  // namespace
}  // namespace troupe::cpu
