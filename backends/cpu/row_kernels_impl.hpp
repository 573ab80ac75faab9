#pragma once
// The row kernels written once over a SIMD "vector traits" type and instantiated by each
// row_kernels_<level>.cpp with its own compiler flags. Everything here has internal linkage (an
// anonymous namespace), so the differently-compiled copies never meet at link time.
//
// A traits type V provides: reg, width, zero(), load(const float*), load_f16(const uint16_t*),
// load_bf16(const uint16_t*), load_q8(const int8_t*) (width int8 → f32), set1(float),
// add/mul/fma(a, b, c) = a*b + c, store(float*, reg), hsum(reg).

#include <cstring>
#include <utility>

#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "model/half_float.hpp"
#include "model/quant/dequantize.hpp"

namespace troupe::cpu {
namespace {

// Reads `count` weights starting at element i as a register, for each plain dtype.
template <class V>
struct load_f32_weights {
  static constexpr int64_t bytes = 4;  // of a weight
  static typename V::reg load(const std::byte* w, int64_t i) { return V::load(reinterpret_cast<const float*>(w) + i); }
  static float scalar(const std::byte* w, int64_t i) {
    float value;
    std::memcpy(&value, w + i * 4, 4);
    return value;
  }
};
template <class V>
struct load_f16_weights {
  static constexpr int64_t bytes = 2;
  static typename V::reg load(const std::byte* w, int64_t i) {
    return V::load_f16(reinterpret_cast<const uint16_t*>(w) + i);
  }
  static float scalar(const std::byte* w, int64_t i) {
    uint16_t bits;
    std::memcpy(&bits, w + i * 2, 2);
    return f16_to_f32(bits);
  }
};
template <class V>
struct load_bf16_weights {
  static constexpr int64_t bytes = 2;
  static typename V::reg load(const std::byte* w, int64_t i) {
    return V::load_bf16(reinterpret_cast<const uint16_t*>(w) + i);
  }
  static float scalar(const std::byte* w, int64_t i) {
    uint16_t bits;
    std::memcpy(&bits, w + i * 2, 2);
    return bf16_to_f32(bits);
  }
};

// out[j] = dot(x_j, w) for N activation rows: each weight register is loaded once and used N
// times, so a small decode batch costs about one pass over the weights.
template <class V, class L, int N, int U>
inline void dot_tile(const float* x, int64_t ldx, const std::byte* w, int64_t k, float* out) {
  constexpr int64_t W = V::width;
  typename V::reg acc[N][U];
  for (int j = 0; j < N; ++j)
    for (int u = 0; u < U; ++u) acc[j][u] = V::zero();
  int64_t i = 0;
  for (; i + W * U <= k; i += W * U) {
    for (int u = 0; u < U; ++u) {
      typename V::reg wv = L::load(w, i + u * W);
      for (int j = 0; j < N; ++j) acc[j][u] = V::fma(wv, V::load(x + j * ldx + i + u * W), acc[j][u]);
    }
  }
  for (; i + W <= k; i += W) {
    typename V::reg wv = L::load(w, i);
    for (int j = 0; j < N; ++j) acc[j][0] = V::fma(wv, V::load(x + j * ldx + i), acc[j][0]);
  }
  float tail[N] = {};
  for (; i < k; ++i) {
    float wi = L::scalar(w, i);
    for (int j = 0; j < N; ++j) tail[j] += wi * x[j * ldx + i];
  }
  for (int j = 0; j < N; ++j) {
    typename V::reg sum = acc[j][0];
    for (int u = 1; u < U; ++u) sum = V::add(sum, acc[j][u]);
    out[j] = V::hsum(sum) + tail[j];
  }
}

// Q8_0: blocks of [f16 scale, 32 x int8]. The scale multiplies the converted block once, and
// the scaled weights are then shared by the N activation rows.
template <class V, int N>
inline void dot_tile_q8_0(const float* x, int64_t ldx, const std::byte* w, int64_t k, float* out) {
  constexpr int64_t W = V::width;
  constexpr int64_t chunks = q8_0_block_size / W;
  typename V::reg acc[N][2];
  for (int j = 0; j < N; ++j) acc[j][0] = acc[j][1] = V::zero();
  const int64_t num_blocks = k / q8_0_block_size;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = w + b * q8_0_block_bytes;
    uint16_t scale_bits;
    std::memcpy(&scale_bits, block, 2);
    const typename V::reg scale = V::set1(f16_to_f32(scale_bits));
    const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
    const float* xb = x + b * q8_0_block_size;
    for (int64_t c = 0; c < chunks; ++c) {
      typename V::reg wv = V::mul(V::load_q8(qs + c * W), scale);
      for (int j = 0; j < N; ++j) acc[j][c & 1] = V::fma(wv, V::load(xb + j * ldx + c * W), acc[j][c & 1]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = V::hsum(V::add(acc[j][0], acc[j][1]));
}

// dot_tile for R weight rows at once (rows `row_stride` bytes apart): out[r * N + j] for weight
// row r and activation row j. Each (row, activation) pair keeps dot_tile's two accumulators and
// order exactly (the same bits), while every activation register now serves R weight rows and
// every weight register N activation rows: many activation rows are bound by FMAs, not loads.
template <class V, class L, int N, int R>
inline void dot_tile_rows(const float* x, int64_t ldx, const std::byte* w, size_t row_stride, int64_t k, float* out) {
  constexpr int64_t W = V::width;
  typename V::reg acc[R][N][2];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) acc[r][j][0] = acc[r][j][1] = V::zero();
  // While a tile streams its R rows, the next tile's rows (R rows further on) are fetched into
  // L2 at the same offset. A 2048-wide f16 row is one 4 KiB page, and the hardware prefetchers
  // stop at page boundaries: without this every row starts with a wait on memory, and short rows
  // stream at about half the rate of long ones (troupe_bench_quant, f16 5632x2048 vs 2048x5632).
  // Each 64-byte line is asked for once, as the step that reaches its start passes (a step is
  // two lines of f32 on AVX-512, half a line of f16 on AVX2). A prefetch never faults, so the
  // last tile's, past the matrix, is harmless.
  constexpr int64_t step_bytes = 2 * W * L::bytes;
  const char* next_tile = reinterpret_cast<const char*>(w) + R * row_stride;
  int64_t i = 0;
  for (; i + 2 * W <= k; i += 2 * W) {
    const int64_t at = i * L::bytes;
    for (int64_t line = (at + 63) / 64 * 64; line < at + step_bytes; line += 64)
      for (int r = 0; r < R; ++r) __builtin_prefetch(next_tile + r * row_stride + line, 0, 2);
    for (int u = 0; u < 2; ++u) {
      typename V::reg wv[R];
      for (int r = 0; r < R; ++r) wv[r] = L::load(w + r * row_stride, i + u * W);
      for (int j = 0; j < N; ++j) {
        const typename V::reg xv = V::load(x + j * ldx + i + u * W);
        for (int r = 0; r < R; ++r) acc[r][j][u] = V::fma(wv[r], xv, acc[r][j][u]);
      }
    }
  }
  for (; i + W <= k; i += W) {
    typename V::reg wv[R];
    for (int r = 0; r < R; ++r) wv[r] = L::load(w + r * row_stride, i);
    for (int j = 0; j < N; ++j) {
      const typename V::reg xv = V::load(x + j * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][j][0] = V::fma(wv[r], xv, acc[r][j][0]);
    }
  }
  float tail[R][N] = {};
  for (; i < k; ++i) {
    for (int r = 0; r < R; ++r) {
      const float wi = L::scalar(w + r * row_stride, i);
      for (int j = 0; j < N; ++j) tail[r][j] += wi * x[j * ldx + i];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) out[r * N + j] = V::hsum(V::add(acc[r][j][0], acc[r][j][1])) + tail[r][j];
}

template <class V, int N, int R>
inline void dot_tile_rows_for(dtype type, const float* x, int64_t ldx, const std::byte* w, size_t row_stride, int64_t k,
                              float* out) {
  switch (type) {
    case dtype::f32: return dot_tile_rows<V, load_f32_weights<V>, N, R>(x, ldx, w, row_stride, k, out);
    case dtype::f16: return dot_tile_rows<V, load_f16_weights<V>, N, R>(x, ldx, w, row_stride, k, out);
    case dtype::bf16: return dot_tile_rows<V, load_bf16_weights<V>, N, R>(x, ldx, w, row_stride, k, out);
    default: return;
  }
}

template <class V, int N>
inline void dot_tile_for(dtype type, const float* x, int64_t ldx, const std::byte* w, int64_t k, float* out) {
  // Two accumulators per activation row whatever N is, so a row's sum is formed in the same
  // order whether it is dotted alone or beside others (batch invariance); two chains of FMAs
  // already stream weights faster than one core's share of memory bandwidth.
  constexpr int U = 2;
  switch (type) {
    case dtype::f32: return dot_tile<V, load_f32_weights<V>, N, U>(x, ldx, w, k, out);
    case dtype::f16: return dot_tile<V, load_f16_weights<V>, N, U>(x, ldx, w, k, out);
    case dtype::bf16: return dot_tile<V, load_bf16_weights<V>, N, U>(x, ldx, w, k, out);
    case dtype::q8_0: return dot_tile_q8_0<V, N>(x, ldx, w, k, out);
    default: return;  // other types go through dot_rows_via_f32
  }
}

// R weight rows at rows [r, r + R) against every activation row, in groups of V::pair_acts (as
// many as the registers hold beside R weight registers), float types only.
template <class V, int R>
inline void dot_row_group(dtype type, const float* x, int64_t n, int64_t ldx, const std::byte* row, size_t row_stride,
                          int64_t k, float* y, int64_t ldy) {
  constexpr int A = V::pair_acts;
  float out[R * A];
  for (int64_t j0 = 0; j0 < n; j0 += A) {
    const float* xj = x + j0 * ldx;
    const int64_t count = n - j0 < A ? n - j0 : A;
    if (count == A) {
      dot_tile_rows_for<V, A, R>(type, xj, ldx, row, row_stride, k, out);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < A; ++j) y[(j0 + j) * ldy + r] = out[r * A + j];
      continue;
    }
    for (int64_t j = 0; j < count; ++j) {
      dot_tile_rows_for<V, 1, R>(type, xj + j * ldx, ldx, row, row_stride, k, out);
      for (int r = 0; r < R; ++r) y[(j0 + j) * ldy + r] = out[r];
    }
  }
}

template <class V>
inline void dot_rows_strided(dtype type, const float* x, int64_t n, int64_t ldx, const std::byte* w, size_t row_stride,
                             int64_t k, int64_t num_rows, float* y, int64_t ldy) {
  float out[4];
  int64_t r = 0;
  // Tiles of V::tile_rows weight rows, then a pair, for the float types; the rest one row at a
  // time. Every output is summed in dot_tile's order whichever tile computes it.
  static_assert(V::pair_acts <= 4, "out[] holds 4");
  if (type == dtype::f32 || type == dtype::f16 || type == dtype::bf16) {
    constexpr int R = V::tile_rows;
    for (; r + R <= num_rows; r += R)
      dot_row_group<V, R>(type, x, n, ldx, w + r * row_stride, row_stride, k, y + r, ldy);
    if constexpr (R > 2) {
      for (; r + 2 <= num_rows; r += 2)
        dot_row_group<V, 2>(type, x, n, ldx, w + r * row_stride, row_stride, k, y + r, ldy);
    }
  }
  for (; r < num_rows; ++r) {
    const std::byte* row = w + r * row_stride;
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
      const float* xj = x + j0 * ldx;
      const int64_t count = n - j0 < 4 ? n - j0 : 4;
      switch (count) {
        case 1: dot_tile_for<V, 1>(type, xj, ldx, row, k, out); break;
        case 2: dot_tile_for<V, 2>(type, xj, ldx, row, k, out); break;
        case 3: dot_tile_for<V, 3>(type, xj, ldx, row, k, out); break;
        default: dot_tile_for<V, 4>(type, xj, ldx, row, k, out); break;
      }
      for (int64_t j = 0; j < count; ++j) y[(j0 + j) * ldy + r] = out[j];
    }
  }
}

template <class V, dtype T>
void dot_rows(const float* x, int64_t n, int64_t ldx, const std::byte* w, int64_t k, int64_t num_rows, float* y,
              int64_t ldy) {
  dot_rows_strided<V>(T, x, n, ldx, w, row_bytes(T, k), k, num_rows, y, ldy);
}

// Any type without a kernel of its own: each weight row is decoded to f32 by the reference
// dequantizer (model/quant), a chunk at a time into a stack buffer, and dotted as f32. Correct
// everywhere, not fast. (No std::vector here: its inline members compiled with this file's ISA
// flags could become the copy the whole program links.)
template <class V, dtype T>
void dot_rows_via_f32(const float* x, int64_t n, int64_t ldx, const std::byte* w, int64_t k, int64_t num_rows, float* y,
                      int64_t ldy) {
  constexpr int64_t chunk = 2048;  // a multiple of every block size
  alignas(64) float decoded[chunk];
  const size_t stride = row_bytes(T, k);
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t j = 0; j < n; ++j) y[j * ldy + r] = 0.0f;
    for (int64_t begin = 0; begin < k; begin += chunk) {
      const int64_t count = k - begin < chunk ? k - begin : chunk;
      quant::dequantize_row(T, w + r * stride + row_bytes(T, begin), decoded, count);
      for (int64_t j = 0; j < n; ++j) {
        float partial;
        dot_tile<V, load_f32_weights<V>, 1, 2>(x + j * ldx + begin, ldx, reinterpret_cast<const std::byte*>(decoded),
                                               count, &partial);
        y[j * ldy + r] += partial;
      }
    }
  }
}

template <dtype T>
void reference_to_f32(const std::byte* src, int64_t count, float* dst) {
  quant::dequantize_row(T, src, dst, count);
}

template <class V, int... I>
void fill_generic_kernels(row_kernels& table, std::integer_sequence<int, I...>) {
  ((table.dot_rows[I] = &dot_rows_via_f32<V, static_cast<dtype>(I)>,
    table.to_f32[I] = &reference_to_f32<static_cast<dtype>(I)>),
   ...);
}

template <class V>
void f32_to_f32(const std::byte* src, int64_t count, float* dst) {
  std::memcpy(dst, src, static_cast<size_t>(count) * 4);
}

template <class V>
void f16_to_f32_rows(const std::byte* src, int64_t count, float* dst) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + V::width <= count; i += V::width) V::store(dst + i, V::load_f16(s + i));
  for (; i < count; ++i) dst[i] = f16_to_f32(s[i]);
}

template <class V>
void bf16_to_f32_rows(const std::byte* src, int64_t count, float* dst) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + V::width <= count; i += V::width) V::store(dst + i, V::load_bf16(s + i));
  for (; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
}

template <class V>
void q8_0_to_f32_rows(const std::byte* src, int64_t count, float* dst) {
  for (int64_t b = 0; b < count / q8_0_block_size; ++b) {
    const std::byte* block = src + b * q8_0_block_bytes;
    uint16_t scale_bits;
    std::memcpy(&scale_bits, block, 2);
    const typename V::reg scale = V::set1(f16_to_f32(scale_bits));
    const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
    for (int64_t c = 0; c < q8_0_block_size; c += V::width)
      V::store(dst + b * q8_0_block_size + c, V::mul(V::load_q8(qs + c), scale));
  }
}

template <class V>
void attention_scores(const float* queries, int64_t num_queries, int64_t ldq, const float* keys, int64_t num_keys,
                      int64_t ldk, int64_t head_dim, float scale, float* scores) {
  dot_rows_strided<V>(dtype::f32, queries, num_queries, ldq, reinterpret_cast<const std::byte*>(keys),
                      static_cast<size_t>(ldk) * 4, head_dim, num_keys, scores, num_keys);
  for (int64_t i = 0; i < num_queries * num_keys; ++i) scores[i] *= scale;
}

template <class V>
void attention_values(const float* probs, int64_t num_queries, int64_t num_keys, const float* values, int64_t ldv,
                      int64_t head_dim, float* out, int64_t ldo) {
  for (int64_t q = 0; q < num_queries; ++q) {
    float* o = out + q * ldo;
    for (int64_t t = 0; t < num_keys; ++t) {
      const typename V::reg p = V::set1(probs[q * num_keys + t]);
      const float* v = values + t * ldv;
      int64_t d = 0;
      for (; d + V::width <= head_dim; d += V::width) V::store(o + d, V::fma(p, V::load(v + d), V::load(o + d)));
      const float ps = probs[q * num_keys + t];
      for (; d < head_dim; ++d) o[d] += ps * v[d];
    }
  }
}

// ---- Products of narrow float weights at many rows (row_kernels.hpp, panel_gemm_fn) -------------
// A tile is two registers of activation rows (lanes are rows) against PR weight rows: per
// element of k, two loads of the transposed activations and PR broadcasts of converted weights
// feed 2 * PR multiply-adds, so the FMA units, not the loads, set the pace.

template <class V>
constexpr int64_t panel_width() {
  return 2 * V::width;
}
// Weight rows per tile: 2 * PR accumulators, two activation registers and a broadcast fit the
// registers (32 on AVX-512, 16 on AVX2), and 2 * PR independent sums cover an FMA's latency on
// both ports (4 cycles x 2; AVX2's 12 sums measured level with 8 on the Intel guest, whose
// noise hid the difference).
template <class V>
constexpr int panel_weight_rows() {
  return V::width >= 16 ? 8 : 6;
}

// The converted weight rows of one chunk, then the partial sums of every tile (up to max_rows
// weight rows against n activation rows) between chunks.
template <class V>
size_t panel_scratch_floats(int64_t k, int64_t n, int64_t max_rows) {
  constexpr int64_t PR = panel_weight_rows<V>();
  constexpr int64_t TW = panel_width<V>();
  return static_cast<size_t>(PR * k + (max_rows + PR - 1) / PR * PR * ((n + TW - 1) / TW * TW));
}

template <class V>
void pack_activations(const float* x, int64_t n, int64_t ldx, int64_t k, float* xt) {
  constexpr int64_t T = panel_width<V>();
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    float* tile = xt + (j0 / T) * k * T;
    const int64_t rows = n - j0 < T ? n - j0 : T;
    for (int64_t i = 0; i < k; ++i) {
      float* column = tile + i * T;
      for (int64_t j = 0; j < rows; ++j) column[j] = x[(j0 + j) * ldx + i];
      for (int64_t j = rows; j < T; ++j) column[j] = 0.0f;
    }
  }
}

// Elements of k per pass over the activations: a pass reads n * chunk floats of the packed
// activations for every PR weight rows, so they stay in L2 (256 KiB, beside the partial sums)
// whatever the prompt.
inline int64_t panel_k_chunk(int64_t n, int64_t k) {
  const int64_t fits = (int64_t{64} << 10) / (n > 0 ? n : 1) / 16 * 16;
  const int64_t chunk = fits < 64 ? 64 : fits;
  return chunk < k ? chunk : k;
}

template <class V>
void panel_gemm(const float* xt, int64_t n, int64_t k, const std::byte* w, dtype type, to_f32_fn convert,
                int64_t num_rows, float* y, int64_t ldy, float* scratch) {
  using reg = typename V::reg;
  constexpr int64_t W = V::width;
  constexpr int64_t TW = panel_width<V>();
  constexpr int PR = panel_weight_rows<V>();
  const size_t stride = row_bytes(type, k);
  const int64_t chunk = panel_k_chunk(n, k);
  const int64_t num_tiles = (n + TW - 1) / TW;
  float* weights = scratch;            // [PR, chunk]
  float* partials = scratch + PR * k;  // [groups of PR rows][tiles][PR, TW]
  for (int64_t c0 = 0; c0 < k; c0 += chunk) {
    const int64_t kn = k - c0 < chunk ? k - c0 : chunk;
    const bool first = c0 == 0, last = c0 + kn == k;
    for (int64_t r0 = 0; r0 < num_rows; r0 += PR) {
      const int64_t rows = num_rows - r0 < PR ? num_rows - r0 : PR;
      // PR weight rows' elements [c0, c0 + kn) as f32 (rows past the last: zero), then read from
      // the core's cache by every tile.
      for (int64_t r = 0; r < PR; ++r) {
        float* dst = weights + r * kn;
        if (r >= rows) {
          for (int64_t i = 0; i < kn; ++i) dst[i] = 0.0f;
        } else {
          convert(w + (r0 + r) * stride + row_bytes(type, c0), kn, dst);
        }
      }
      for (int64_t t = 0; t < num_tiles; ++t) {
        const float* tile = xt + t * k * TW + c0 * TW;
        // Each output goes on from its sum over the earlier chunks: its products are added in
        // k's order whatever the chunks.
        float* part = partials + ((r0 / PR) * num_tiles + t) * PR * TW;
        reg acc[PR][2];
        for (int r = 0; r < PR; ++r) {
          acc[r][0] = first ? V::zero() : V::load(part + r * TW);
          acc[r][1] = first ? V::zero() : V::load(part + r * TW + W);
        }
        for (int64_t i = 0; i < kn; ++i) {
          const reg x0 = V::load(tile + i * TW), x1 = V::load(tile + i * TW + W);
          for (int r = 0; r < PR; ++r) {
            const reg b = V::set1(weights[r * kn + i]);
            acc[r][0] = V::fma(b, x0, acc[r][0]);
            acc[r][1] = V::fma(b, x1, acc[r][1]);
          }
        }
        for (int r = 0; r < PR; ++r) {
          V::store(part + r * TW, acc[r][0]);
          V::store(part + r * TW + W, acc[r][1]);
        }
        if (!last) continue;
        const int64_t j0 = t * TW;
        const int64_t count = n - j0 < TW ? n - j0 : TW;
        for (int64_t j = 0; j < count; ++j)
          for (int64_t r = 0; r < rows; ++r) y[(j0 + j) * ldy + r0 + r] = part[r * TW + j];
      }
    }
  }
}

template <class V>
row_kernels make_row_kernels() {
  row_kernels table{};
  fill_generic_kernels<V>(table, std::make_integer_sequence<int, num_dtypes>{});
  table.dot_rows[static_cast<int>(dtype::f32)] = &dot_rows<V, dtype::f32>;
  table.dot_rows[static_cast<int>(dtype::f16)] = &dot_rows<V, dtype::f16>;
  table.dot_rows[static_cast<int>(dtype::bf16)] = &dot_rows<V, dtype::bf16>;
  table.dot_rows[static_cast<int>(dtype::q8_0)] = &dot_rows<V, dtype::q8_0>;
  table.to_f32[static_cast<int>(dtype::f32)] = &f32_to_f32<V>;
  table.to_f32[static_cast<int>(dtype::f16)] = &f16_to_f32_rows<V>;
  table.to_f32[static_cast<int>(dtype::bf16)] = &bf16_to_f32_rows<V>;
  table.to_f32[static_cast<int>(dtype::q8_0)] = &q8_0_to_f32_rows<V>;
  table.attention_scores = &attention_scores<V>;
  table.attention_values = &attention_values<V>;
  if constexpr (V::width > 1) {
    table.panel_gemm = &panel_gemm<V>;
    table.pack_activations = &pack_activations<V>;
    table.panel_tile_rows = static_cast<int>(panel_width<V>());
    // AVX-512 against OpenBLAS's SkylakeX sgemm: ahead to 256 rows, behind from 512. AVX2 against
    // its Haswell sgemm (forced on the Intel guest): ahead at 32 rows (1.05-1.75x), level to
    // behind from 128 (0.72-1.23x), so there the slabs keep them.
    table.panel_max_rows = V::width >= 16 ? 512 : 128;
    table.panel_scratch_floats = &panel_scratch_floats<V>;
  }
  return table;
}

// The quantized types convert through their integer kernels' decoders (quant_kernels.hpp), which
// give the reference dequantizer's floats bit for bit.
inline row_kernels with_quant_to_f32(row_kernels table, const quant_kernels& quantized) {
  for (int i = 0; i < num_dtypes; ++i) {
    if (quantized.to_f32[i] != nullptr) table.to_f32[i] = quantized.to_f32[i];
  }
  return table;
}

}  // namespace
}  // namespace troupe::cpu
