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
// chunk serves every activation row of the call while it sits in L1.
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

// A tile's decoded chunk, in the thread's scratch.
template <class V>
struct tile_buffers {
  static constexpr int R = V::R;
  static constexpr int64_t max_subs = chunk_elements / 16;
  alignas(64) int8_t codes[R][chunk_elements];        // row-major, as decoded
  alignas(64) uint8_t w[chunk_elements / 4][R][4];    // interleaved: 4 codes of every row
  alignas(64) float D_rows[R][max_subs];
  alignas(64) float M_rows[R][max_subs];
  alignas(64) float D[max_subs][R];                   // per sub-block, a lane per row
  alignas(64) float M[max_subs][R];
};

// Decodes elements [e0, e0 + count) of rows [0, rows) of the tile at w (rows `stride` apart);
// lanes past `rows` get zero codes and scales.
template <class V, class T>
void build_tile(tile_buffers<V>& t, const std::byte* w, size_t stride, int rows, int64_t e0,
                int64_t count) {
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
  V::interleave(&t.codes[0][0], count, &t.w[0][0][0]);
  for (int64_t s = 0; s < num_subs; ++s) {
    for (int r = 0; r < R; ++r) {
      t.D[s][r] = t.D_rows[r][s];
      if constexpr (T::has_min) t.M[s][r] = t.M_rows[r][s];
    }
  }
}

inline int32_t load_a4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Adds one decoded chunk (num_blocks activation blocks) to the sums of N activation rows: x[j]
// is activation row j's first block of the chunk; acc/accm [N][R] carry the sums between chunks.
template <class V, class T, int N>
void multiply_chunk(const tile_buffers<V>& t, int64_t num_blocks, const act_block* const* x,
                    float* acc_mem, float* accm_mem) {
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
        const typename V::wreg wv = V::load_w(&t.w[group][0][0]);
        const int64_t at = h * T::sub + 4 * g;  // within the activation block
        if constexpr (policy::sign_trick) {
          const typename V::wreg wabs = V::abs8(wv);
          for (int j = 0; j < N; ++j) dot[j] = V::dot4_signed(dot[j], wv, wabs, load_a4(x[j][b].q + at));
        } else {
          for (int j = 0; j < N; ++j) dot[j] = V::dot4(dot[j], wv, load_a4(x[j][b].q + at));
        }
      }
      const typename V::freg D = V::fload(t.D[s]);
      for (int j = 0; j < N; ++j) {
        if constexpr (policy::offset != 0) dot[j] = V::isub(dot[j], x[j][b].corr[h]);
        acc[j] = V::fma(V::cvt(dot[j]), V::fmul(D, V::fset1(x[j][b].d)), acc[j]);
      }
      if constexpr (T::has_min) {
        const typename V::freg M = V::fload(t.M[s]);
        for (int j = 0; j < N; ++j) accm[j] = V::fma(M, V::fset1(x[j][b].dsum[h]), accm[j]);
      }
    }
  }
  for (int j = 0; j < N; ++j) {
    V::fstore(acc_mem + j * R, acc[j]);
    if constexpr (T::has_min) V::fstore(accm_mem + j * R, accm[j]);
  }
}

template <class V>
constexpr size_t align64(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

// Per thread: the tile buffers, then the sums of n activation rows ([n][R] each for acc, accm).
template <class V>
size_t quant_scratch_bytes(int64_t n) {
  return align64<V>(sizeof(tile_buffers<V>)) + 2 * align64<V>(static_cast<size_t>(n) * V::R * sizeof(float)) + 64;
}

template <class V, class T>
void quant_matmul(const std::byte* w, int64_t k, int64_t num_rows, const act_block* x, int64_t n,
                  float* y, int64_t ldy, std::byte* scratch) {
  constexpr int R = V::R;
  constexpr int A = V::act_rows;
  const size_t stride = row_bytes(T::type, k);
  const int64_t x_blocks = k / 32;
  std::byte* base = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(scratch) + 63) / 64 * 64);
  auto& t = *reinterpret_cast<tile_buffers<V>*>(base);
  float* acc = reinterpret_cast<float*>(base + align64<V>(sizeof(tile_buffers<V>)));  // [n][R]
  float* accm = acc + align64<V>(static_cast<size_t>(n) * R * sizeof(float)) / sizeof(float);  // [n][R]
  const act_block* rows_x[A];
  for (int64_t r0 = 0; r0 < num_rows; r0 += R) {
    const int rows = static_cast<int>(smaller(R, num_rows - r0));
    fill_zero(acc, n * R);
    if constexpr (T::has_min) fill_zero(accm, n * R);
    for (int64_t e0 = 0; e0 < k; e0 += chunk_elements) {
      const int64_t count = smaller(chunk_elements, k - e0);
      build_tile<V, T>(t, w + r0 * stride, stride, rows, e0, count);
      const int64_t num_blocks = count / 32;
      int64_t j = 0;
      for (; j + A <= n; j += A) {
        for (int i = 0; i < A; ++i) rows_x[i] = x + (j + i) * x_blocks + e0 / 32;
        multiply_chunk<V, T, A>(t, num_blocks, rows_x, acc + j * R, accm + j * R);
      }
      for (; j < n; ++j) {
        rows_x[0] = x + j * x_blocks + e0 / 32;
        multiply_chunk<V, T, 1>(t, num_blocks, rows_x, acc + j * R, accm + j * R);
      }
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
  return table;
}

}  // namespace
}  // namespace troupe::cpu
