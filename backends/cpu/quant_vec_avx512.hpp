#pragma once
// The AVX-512 traits of the integer kernels (quant_kernels_impl.hpp): sixteen weight rows per
// register. Vnni picks the int8 product: vpdpbusd (one instruction for 4 products and the sum),
// or maddubs + madd as on AVX2. Included only by quant_kernels_avx512.cpp and
// quant_kernels_avx512vnni.cpp, each compiled with its own flags.
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (a known header issue).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backends/cpu/quant_bytes_x86.hpp"
#include "backends/cpu/quant_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

template <bool Vnni>
struct avx512_qvec : x86_bytes<true> {
  static constexpr int R = 16;
  static constexpr bool vnni = Vnni;
  static constexpr int act_rows = 4;
  using ireg = __m512i;
  using wreg = __m512i;
  using freg = __m512;

  static ireg izero() { return _mm512_setzero_si512(); }
  static wreg load_w(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static ireg dot4(ireg acc, wreg w, int32_t a4) {
    if constexpr (Vnni) {
      return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(a4));
    } else {
      const __m512i pairs = _mm512_maddubs_epi16(w, _mm512_set1_epi32(a4));
      return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
    }
  }
  static wreg abs8(wreg w) { return _mm512_abs_epi8(w); }
  // The two codes of a repacked byte (quant_repack.hpp): its low and its high nibble.
  static wreg low_nibbles(wreg w) { return _mm512_and_si512(w, _mm512_set1_epi8(0x0f)); }
  static wreg high_nibbles(wreg w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(0x0f)); }
  // Bits 2T, 2T + 1 of each byte moved to bits 4, 5 (Q6_K's top bits over its low nibble); the
  // 16-bit shifts' spill into the neighbouring byte falls outside the mask.
  template <int T>
  static wreg top_bits(wreg w) {
    const __m512i mask = _mm512_set1_epi8(0x30);
    if constexpr (T < 3) return _mm512_and_si512(_mm512_slli_epi16(w, 4 - 2 * T), mask);
    return _mm512_and_si512(_mm512_srli_epi16(w, 2), mask);
  }
  // Bit B of each byte moved to bit 4 (Q5_K's fifth bit over its low nibble); as in top_bits the
  // spill of the 16-bit shifts stays outside the mask.
  template <int B>
  static wreg bit_to_4(wreg w) {
    const __m512i mask = _mm512_set1_epi8(0x10);
    if constexpr (B < 4) return _mm512_and_si512(_mm512_slli_epi16(w, 4 - B), mask);
    if constexpr (B == 4) return _mm512_and_si512(w, mask);
    return _mm512_and_si512(_mm512_srli_epi16(w, B - 4), mask);
  }
  // 16 table bytes in every 128-bit lane, and each byte of idx (0..15) replaced by its entry
  // (IQ4_XS's levels looked up from its repacked indices).
  static wreg table16(const int8_t* levels) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)));
  }
  static wreg lookup16(wreg table, wreg idx) { return _mm512_shuffle_epi8(table, idx); }
  static wreg or_w(wreg a, wreg b) { return _mm512_or_si512(a, b); }
  // Signed codes as unsigned code + 128 (the sign bit flipped): repacked Q8_0 under vpdpbusd.
  static wreg plus_128(wreg w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }
  // |w| x (a with w's sign): AVX-512 has no vpsignb, so negate a where w < 0 (where w = 0 the
  // product is 0 through |w| anyway).
  static ireg dot4_signed(ireg acc, wreg w, wreg w_abs, int32_t a4) {
    const __m512i a = _mm512_set1_epi32(a4);
    const __m512i signed_a = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
    const __m512i pairs = _mm512_maddubs_epi16(w_abs, signed_a);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
  static ireg isub(ireg acc, int32_t v) { return _mm512_sub_epi32(acc, _mm512_set1_epi32(v)); }
  static freg cvt(ireg v) { return _mm512_cvtepi32_ps(v); }
  static freg fzero() { return _mm512_setzero_ps(); }
  static freg fload(const float* p) { return _mm512_loadu_ps(p); }
  // R f16 values widened (exact, as the decoders' half()).
  static freg fload_half(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void fstore(float* p, freg v) { _mm512_storeu_ps(p, v); }
  static freg fset1(float v) { return _mm512_set1_ps(v); }
  static freg fmul(freg a, freg b) { return _mm512_mul_ps(a, b); }
  static freg fadd(freg a, freg b) { return _mm512_add_ps(a, b); }
  static freg fma(freg a, freg b, freg c) { return _mm512_fmadd_ps(a, b, c); }
  static freg cvt_codes(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }

  // codes [16][256] → out [count / 4][16][4]: a 16 x 16 transpose of dwords per 64 columns (a
  // last partial column reads and writes past `count` inside the buffers; those groups are
  // never multiplied).
  static void interleave(const int8_t* codes, int64_t count, uint8_t* out) {
    for (int64_t c = 0; c < count; c += 64) {
      __m512i r[16], t[16], u[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(codes + i * chunk_elements + c);
      for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      }
      // u[4i + m], 128-bit lane L: rows 4i..4i+3 of dword 4L + m.
      for (int i = 0; i < 4; ++i) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
      }
      uint8_t* dst = out + c * 16;  // group c / 4, 64 bytes each
      for (int m = 0; m < 4; ++m) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
        _mm512_storeu_si512(dst + (0 + m) * 64, _mm512_shuffle_i32x4(v0, v2, 0x88));
        _mm512_storeu_si512(dst + (4 + m) * 64, _mm512_shuffle_i32x4(v0, v2, 0xdd));
        _mm512_storeu_si512(dst + (8 + m) * 64, _mm512_shuffle_i32x4(v1, v3, 0x88));
        _mm512_storeu_si512(dst + (12 + m) * 64, _mm512_shuffle_i32x4(v1, v3, 0xdd));
      }
    }
  }

  static float absmax32(const float* x, bool* finite) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const __mmask16 unordered = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    const float result = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    if (unordered != 0 || result > std::numeric_limits<float>::max()) *finite = false;
    return result;
  }
  static void round32(const float* x, float d, int8_t* q, int32_t* sums) {
    const __m512 dv = _mm512_set1_ps(d);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int h = 0; h < 2; ++h) {
      __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(x + 16 * h), dv));
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      sums[h] += _mm512_reduce_add_epi32(v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(v));
    }
  }
};

}  // namespace
}  // namespace troupe::cpu
