#pragma once
// The integer kernels written once over a SIMD traits type V and instantiated by each
// quant_kernels_<level>.cpp with its own compiler flags. Everything has internal linkage (an
// anonymous namespace), so the differently-compiled copies never meet at link time.
//
// Lanes are weight rows: a tile of V::R rows (16 with AVX-512, 8 with AVX2, 1 scalar) is decoded
// a chunk of 256 elements at a time into integer codes and interleaved so that one register
// holds 4 consecutive codes of each of the R rows ([chunk / 4][R][4] bytes). One int8 dot
// instruction with 4 activation bytes broadcast then adds 4 products to every row's lane, and a
// lane ends a sub-block holding that row's exact integer dot: no horizontal sums, and the decoded
// tile serves every activation row of the call (see quant_matmul for the two schedules).
//
// The canonical sum. For weight row r and activation row j:
//   acc = 0; accm = 0
//   for each activation block b, for each weight sub-block s inside it (one of 32 or two of 16):
//     I    = Σ code · q over s, exactly in int32, minus the block's corr (the codes' offset)
//     acc  = fma(float(I), D_s * d_b, acc)          (D_s * d_b rounded to f32 first)
//     accm = fma(M_s, dsum_b,s, accm)               (types with a min)
//   y = acc + accm
// Every path (any number of activation rows, any thread split, any level: the scalar level uses
// std::fma) computes exactly this, so results are bit for bit the same across them.
//
// V provides: R; vnni; act_rows (activation rows kept in registers at once); ireg, wreg, freg;
// izero, load_w(R x 4 bytes), dot4(acc, w, 4 activation bytes) for unsigned codes, abs8 and
// dot4_signed(acc, w, |w|, a4) for signed ones; isub(acc, int); cvt; fzero, fload, fstore,
// fset1, fmul, fadd, fma; cvt_codes (R int8 → R floats); interleave(codes [R][256], count, out);
// absmax32(x, finite) and round32(x, d, q, half sums) for the activation quantizer; and the byte
// operations the decoders are written in (quant_bytes_x86.hpp).

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/quant_codes.hpp"
#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/quant_repack.hpp"

namespace troupe::cpu {
namespace {

// Elements of a row decoded at a time: one k-quant super-block, eight legacy blocks.
constexpr int64_t chunk_elements = 256;

// No std::min / std::fill here: a template instantiated in an ISA-flagged file has vague linkage,
// and its copy could be the one a portable caller ends up linked to.
constexpr int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }
inline void fill_zero(float* p, int64_t count) {
  for (int64_t i = 0; i < count; ++i) p[i] = 0.0f;
}

// How type T's codes meet int8 activations on V.
template <class V, class T>
struct code_policy {
  // Without VNNI the product is maddubs, which adds two u8 x s8 products in a saturating int16:
  // codes spanning more than 128 values (q8_0, iq4_nl, iq4_xs) could overflow it, so those stay
  // signed and multiply as |code| x (q with code's sign).
  static constexpr bool sign_trick = V::R > 1 && !V::vnni && (T::max_code - T::min_code > 128);
  // SIMD products take unsigned bytes on the weights' side: codes are shifted up by this much and
  // the activations' corr (offset * Σq) takes it back out. The scalar level multiplies signed.
  static constexpr int offset = (V::R == 1 || sign_trick) ? 0 : -T::min_code;
};

// ---- activations ---------------------------------------------------------------------------

template <class V, class T>
void quantize_acts(const float* x, int64_t k, act_block* out) {
  constexpr int offset = code_policy<V, T>::offset;
  for (int64_t b = 0; b < k / 32; ++b) {
    act_block& a = out[b];
    const float* xb = x + b * 32;
    bool finite = true;
    const float amax = V::absmax32(xb, &finite);
    int32_t sums[2] = {0, 0};  // Σq of each half
    if (!finite) {
      a.d = std::numeric_limits<float>::quiet_NaN();
      std::memset(a.q, 0, sizeof a.q);
    } else {
      a.d = amax / 127.0f;
      if (a.d > 0.0f) {
        V::round32(xb, a.d, a.q, sums);
      } else {
        std::memset(a.q, 0, sizeof a.q);
      }
    }
    if constexpr (T::sub == 16) {
      for (int h = 0; h < 2; ++h) {
        a.dsum[h] = a.d * static_cast<float>(sums[h]);
        a.corr[h] = offset * sums[h];
      }
    } else {
      a.dsum[0] = a.d * static_cast<float>(sums[0] + sums[1]);
      a.corr[0] = offset * (sums[0] + sums[1]);
      a.dsum[1] = 0.0f;
      a.corr[1] = 0;
    }
  }
}

// ---- weight tiles --------------------------------------------------------------------------

// One chunk of a tile as decoded, row-major, before it is interleaved (thread scratch).
template <class V>
struct chunk_staging {
  static constexpr int R = V::R;
  static constexpr int64_t max_subs = chunk_elements / 16;
  alignas(64) int8_t codes[R][chunk_elements];
  alignas(64) float D_rows[R][max_subs];
  alignas(64) float M_rows[R][max_subs];
};

// A decoded tile over a span of elements: w [span / 4][R][4] (4 codes of every row per group),
// D and M [span / sub][R] (a lane per row). Chunk c of a span lives at w + c * 256 * R,
// D + c * (256 / sub) * R.
struct tile_span {
  uint8_t* w;
  float* D;
  float* M;
};

// Decodes elements [e0, e0 + count) of rows [0, rows) of the tile at w (rows `stride` apart) into
// `out` (already offset to the chunk); lanes past `rows` get zero codes and scales.
template <class V, class T>
void build_tile(chunk_staging<V>& t, const std::byte* w, size_t stride, int rows, int64_t e0, int64_t count,
                const tile_span& out) {
  constexpr int R = V::R;
  constexpr int offset = code_policy<V, T>::offset;
  const int64_t num_subs = count / T::sub;
  for (int r = 0; r < R; ++r) {
    if (r < rows) {
      T::template decode<V, offset>(w + r * stride + row_bytes(T::type, e0), count / T::block, t.codes[r], t.D_rows[r],
                                    t.M_rows[r]);
    } else {
      std::memset(t.codes[r], 0, static_cast<size_t>(count));
      for (int64_t s = 0; s < num_subs; ++s) t.D_rows[r][s] = t.M_rows[r][s] = 0.0f;
    }
  }
  V::interleave(&t.codes[0][0], count, out.w);
  for (int64_t s = 0; s < num_subs; ++s) {
    for (int r = 0; r < R; ++r) {
      out.D[s * R + r] = t.D_rows[r][s];
      if constexpr (T::has_min) out.M[s * R + r] = t.M_rows[r][s];
    }
  }
}

inline int32_t load_a4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Adds num_blocks activation blocks' worth of a decoded tile to the sums of N activation rows:
// x[j] is activation row j's first block of the span; acc/accm [N][R] carry the sums in and out.
template <class V, class T, int N>
void multiply(const tile_span& t, int64_t num_blocks, const act_block* const* x, float* acc_mem, float* accm_mem) {
  using policy = code_policy<V, T>;
  constexpr int R = V::R;
  constexpr int subs_per_block = 32 / T::sub;
  typename V::freg acc[N], accm[N];
  for (int j = 0; j < N; ++j) {
    acc[j] = V::fload(acc_mem + j * R);
    if constexpr (T::has_min) accm[j] = V::fload(accm_mem + j * R);
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int h = 0; h < subs_per_block; ++h) {
      const int64_t s = b * subs_per_block + h;
      typename V::ireg dot[N];
      for (int j = 0; j < N; ++j) dot[j] = V::izero();
      for (int g = 0; g < T::sub / 4; ++g) {
        const int64_t group = s * (T::sub / 4) + g;
        const typename V::wreg wv = V::load_w(t.w + group * R * 4);
        const int64_t at = h * T::sub + 4 * g;  // within the activation block
        if constexpr (policy::sign_trick) {
          const typename V::wreg wabs = V::abs8(wv);
          for (int j = 0; j < N; ++j) dot[j] = V::dot4_signed(dot[j], wv, wabs, load_a4(x[j][b].q + at));
        } else {
          for (int j = 0; j < N; ++j) dot[j] = V::dot4(dot[j], wv, load_a4(x[j][b].q + at));
        }
      }
      const typename V::freg D = V::fload(t.D + s * R);
      for (int j = 0; j < N; ++j) {
        if constexpr (policy::offset != 0) dot[j] = V::isub(dot[j], x[j][b].corr[h]);
        acc[j] = V::fma(V::cvt(dot[j]), V::fmul(D, V::fset1(x[j][b].d)), acc[j]);
      }
      if constexpr (T::has_min) {
        const typename V::freg M = V::fload(t.M + s * R);
        for (int j = 0; j < N; ++j) accm[j] = V::fma(M, V::fset1(x[j][b].dsum[h]), accm[j]);
      }
    }
  }
  for (int j = 0; j < N; ++j) {
    V::fstore(acc_mem + j * R, acc[j]);
    if constexpr (T::has_min) V::fstore(accm_mem + j * R, accm[j]);
  }
}

// multiply() for `count` (1 .. V::act_rows) activation rows from row j0 on, x_blocks blocks apart.
template <class V, class T>
void multiply_rows(const tile_span& t, int64_t num_blocks, const act_block* x, int64_t x_blocks, int64_t j0,
                   int64_t count, float* acc, float* accm) {
  constexpr int R = V::R;
  const act_block* rows_x[V::act_rows];
  for (int64_t i = 0; i < count; ++i) rows_x[i] = x + (j0 + i) * x_blocks;
  float* a = acc + j0 * R;
  float* am = accm + j0 * R;
  switch (count) {
    case 1: return multiply<V, T, 1>(t, num_blocks, rows_x, a, am);
    case 2:
      if constexpr (V::act_rows >= 2) return multiply<V, T, 2>(t, num_blocks, rows_x, a, am);
      break;
    case 3:
      if constexpr (V::act_rows >= 3) return multiply<V, T, 3>(t, num_blocks, rows_x, a, am);
      break;
    default: return multiply<V, T, V::act_rows>(t, num_blocks, rows_x, a, am);
  }
}

// Asks for the blocks of rows [0, rows) at byte offset `at` of each row (`bytes` of them): a
// tile reads R strided streams a few hundred bytes at a time, which the hardware prefetchers do
// not follow well, so the next chunk is requested while this one is multiplied, into L2 (as the
// repacked kernels do; Q3_K_M decode of the 1.1 B model 1.06-1.09x against L1).
inline void prefetch_chunk(const std::byte* w, size_t stride, int rows, size_t at, size_t bytes) {
  for (int r = 0; r < rows; ++r) {
    const std::byte* p = w + r * stride + at;
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
  }
}

template <class V>
constexpr size_t align64(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

// k rounded up to whole chunks: interleave() writes whole 64-column groups, past a short last chunk.
constexpr size_t padded_width(int64_t k) {
  return static_cast<size_t>((k + chunk_elements - 1) / chunk_elements * chunk_elements);
}

// Per thread: the chunk staging; a tile decoded over all k (codes padded_width(k) * R bytes, D and
// M padded_width(k) / 16 * R floats each); the sums of n activation rows ([n][R] each).
template <class V>
size_t quant_scratch_bytes(int64_t n, int64_t k) {
  const size_t R = V::R;
  return align64<V>(sizeof(chunk_staging<V>)) + align64<V>(padded_width(k) * R) +
         2 * align64<V>(padded_width(k) / 16 * R * sizeof(float)) +
         2 * align64<V>(static_cast<size_t>(n) * R * sizeof(float)) + 64;
}

// Two schedules, one canonical sum (the same bits):
// - up to V::act_rows activation rows (decode): a chunk of 256 elements is decoded into L1 and
//   multiplied by every activation row at once, the sums carried from chunk to chunk;
// - more rows (batched decode, prompts): the tile is decoded over all of k once (L2: k * R bytes
//   plus scales), then each group of act_rows activation rows runs along it with its sums in
//   registers, its activations in L1 (sweeping every row's blocks at each chunk would not fit).
template <class V, class T>
void quant_matmul(const std::byte* w, int64_t k, int64_t num_rows, const act_block* x, int64_t n, float* y, int64_t ldy,
                  std::byte* scratch) {
  constexpr int R = V::R;
  constexpr int A = V::act_rows;
  const size_t stride = row_bytes(T::type, k);
  const int64_t x_blocks = k / 32;
  std::byte* base = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(scratch) + 63) / 64 * 64);
  auto& staging = *reinterpret_cast<chunk_staging<V>*>(base);
  base += align64<V>(sizeof(chunk_staging<V>));
  uint8_t* tile_w = reinterpret_cast<uint8_t*>(base);  // [padded_width(k) / 4][R][4]
  base += align64<V>(padded_width(k) * R);
  float* tile_D = reinterpret_cast<float*>(base);  // [padded_width(k) / sub][R]
  base += align64<V>(padded_width(k) / 16 * R * sizeof(float));
  float* tile_M = reinterpret_cast<float*>(base);  // [padded_width(k) / sub][R]
  base += align64<V>(padded_width(k) / 16 * R * sizeof(float));
  float* acc = reinterpret_cast<float*>(base);                                                 // [n][R]
  float* accm = acc + align64<V>(static_cast<size_t>(n) * R * sizeof(float)) / sizeof(float);  // [n][R]
  const bool few_rows = n <= A;
  for (int64_t r0 = 0; r0 < num_rows; r0 += R) {
    const int rows = static_cast<int>(smaller(R, num_rows - r0));
    fill_zero(acc, n * R);
    if constexpr (T::has_min) fill_zero(accm, n * R);
    for (int64_t e0 = 0; e0 < k; e0 += chunk_elements) {
      const int64_t count = smaller(chunk_elements, k - e0);
      // Few rows reuse the first chunk's place (L1); more keep the whole width.
      const int64_t at = few_rows ? 0 : e0;
      const tile_span chunk{tile_w + at * R, tile_D + at / T::sub * R, tile_M + at / T::sub * R};
      build_tile<V, T>(staging, w + r0 * stride, stride, rows, e0, count, chunk);
      if (e0 + chunk_elements < k) {
        prefetch_chunk(w + r0 * stride, stride, rows, row_bytes(T::type, e0 + chunk_elements),
                       row_bytes(T::type, smaller(chunk_elements, k - e0 - chunk_elements)));
      } else if (r0 + R < num_rows) {
        prefetch_chunk(w + (r0 + R) * stride, stride, static_cast<int>(smaller(R, num_rows - r0 - R)), 0,
                       row_bytes(T::type, smaller(chunk_elements, k)));
      }
      if (few_rows) multiply_rows<V, T>(chunk, count / 32, x + e0 / 32, x_blocks, 0, n, acc, accm);
    }
    if (!few_rows) {
      // The next tile's rows, whole, while this one is multiplied (tens of microseconds at these
      // row counts): decoded back to back, its chunks would otherwise wait on DRAM line by line.
      if (r0 + R < num_rows)
        prefetch_chunk(w + (r0 + R) * stride, stride, static_cast<int>(smaller(R, num_rows - r0 - R)), 0, stride);
      const tile_span whole{tile_w, tile_D, tile_M};
      for (int64_t j = 0; j < n; j += A)
        multiply_rows<V, T>(whole, k / 32, x, x_blocks, j, smaller(A, n - j), acc, accm);
    }
    for (int64_t j = 0; j < n; ++j) {
      float* out = y + j * ldy + r0;
      for (int r = 0; r < rows; ++r) out[r] = T::has_min ? acc[j * R + r] + accm[j * R + r] : acc[j * R + r];
    }
  }
}

// ---- to f32 --------------------------------------------------------------------------------

// D * code (+ M), a multiply then an add as the reference dequantizer rounds them.
template <class V, class T>
void codes_to_f32(const std::byte* src, int64_t count, float* dst) {
  alignas(64) int8_t codes[chunk_elements];
  float D[chunk_elements / 16], M[chunk_elements / 16];
  for (int64_t e0 = 0; e0 < count; e0 += chunk_elements) {
    const int64_t n = smaller(chunk_elements, count - e0);
    T::template decode<V, 0>(src + row_bytes(T::type, e0), n / T::block, codes, D, M);
    for (int64_t s = 0; s < n / T::sub; ++s) {
      const typename V::freg d = V::fset1(D[s]);
      for (int64_t i = s * T::sub; i < (s + 1) * T::sub; i += V::R) {
        typename V::freg v = V::fmul(V::cvt_codes(codes + i), d);
        if constexpr (T::has_min) v = V::fadd(v, V::fset1(M[s]));
        V::fstore(dst + e0 + i, v);
      }
    }
  }
}

}  // namespace
}  // namespace troupe::cpu

#include "backends/cpu/quant_repacked_impl.hpp"

namespace troupe::cpu {
namespace {

// ---- the table -----------------------------------------------------------------------------

template <class V>
quant_kernels make_quant_kernels() {
  quant_kernels table{};
  for (int i = 0; i < num_dtypes; ++i) {
    with_codes(static_cast<dtype>(i), [&](auto codes) {
      using T = decltype(codes);
      table.quantize_acts[i] = &quantize_acts<V, T>;
      table.matmul[i] = &quant_matmul<V, T>;
      table.to_f32[i] = &codes_to_f32<V, T>;
    });
  }
  table.scratch_bytes = &quant_scratch_bytes<V>;
  if constexpr (V::R > 1) {
    table.matmul_repacked[static_cast<int>(dtype::q4_k)] = &quant_matmul_repacked<V, q4_k_codes>;
    table.matmul_repacked[static_cast<int>(dtype::q5_k)] = &quant_matmul_repacked<V, q5_k_codes>;
    table.matmul_repacked[static_cast<int>(dtype::q6_k)] = &quant_matmul_repacked<V, q6_k_codes>;
    table.matmul_repacked[static_cast<int>(dtype::iq4_xs)] = &quant_matmul_repacked<V, iq4_xs_codes>;
    table.matmul_repacked[static_cast<int>(dtype::q4_0)] = &quant_matmul_repacked<V, q4_0_codes>;
    table.matmul_repacked[static_cast<int>(dtype::q8_0)] = &quant_matmul_repacked<V, q8_0_codes>;
    table.repack_rows = V::R;
  }
  return table;
}

}  // namespace
}  // namespace troupe::cpu
