// Integer kernels for AVX2 (+ FMA, F16C): eight weight rows per register, maddubs + madd for the
// int8 products (this file is compiled with -mavx2 -mfma -mf16c and only called when the CPU
// reports those features).
#include <immintrin.h>

#include "backends/cpu/quant_bytes_x86.hpp"
#include "backends/cpu/quant_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx2_qvec : x86_bytes<false> {
  static constexpr int R = 8;
  static constexpr bool vnni = false;
  static constexpr int act_rows = 4;
  using ireg = __m256i;
  using wreg = __m256i;
  using freg = __m256;

  static ireg izero() { return _mm256_setzero_si256(); }
  static wreg load_w(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  // u8 codes x s8 activations: pairs of products in int16 (codes <= 128, |q| <= 127: no
  // saturation), then pairs of those in int32.
  static ireg dot4(ireg acc, wreg w, int32_t a4) {
    const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(a4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static wreg abs8(wreg w) { return _mm256_abs_epi8(w); }
  // The two codes of a repacked byte (quant_repack.hpp): its low and its high nibble.
  static wreg low_nibbles(wreg w) { return _mm256_and_si256(w, _mm256_set1_epi8(0x0f)); }
  static wreg high_nibbles(wreg w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0f)); }
  // Bits 2T, 2T + 1 of each byte moved to bits 4, 5 (Q6_K's top bits over its low nibble); the
  // 16-bit shifts' spill into the neighbouring byte falls outside the mask.
  template <int T>
  static wreg top_bits(wreg w) {
    const __m256i mask = _mm256_set1_epi8(0x30);
    if constexpr (T < 3) return _mm256_and_si256(_mm256_slli_epi16(w, 4 - 2 * T), mask);
    return _mm256_and_si256(_mm256_srli_epi16(w, 2), mask);
  }
  // Bit B of each byte moved to bit 4 (Q5_K's fifth bit over its low nibble); as in top_bits the
  // spill of the 16-bit shifts stays outside the mask.
  template <int B>
  static wreg bit_to_4(wreg w) {
    const __m256i mask = _mm256_set1_epi8(0x10);
    if constexpr (B < 4) return _mm256_and_si256(_mm256_slli_epi16(w, 4 - B), mask);
    if constexpr (B == 4) return _mm256_and_si256(w, mask);
    return _mm256_and_si256(_mm256_srli_epi16(w, B - 4), mask);
  }
  // 16 table bytes in every 128-bit lane, and each byte of idx (0..15) replaced by its entry
  // (IQ4_XS's levels looked up from its repacked indices).
  static wreg table16(const int8_t* levels) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)));
  }
  static wreg lookup16(wreg table, wreg idx) { return _mm256_shuffle_epi8(table, idx); }
  static wreg or_w(wreg a, wreg b) { return _mm256_or_si256(a, b); }
  static ireg dot4_signed(ireg acc, wreg w, wreg w_abs, int32_t a4) {
    const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(_mm256_set1_epi32(a4), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static ireg isub(ireg acc, int32_t v) { return _mm256_sub_epi32(acc, _mm256_set1_epi32(v)); }
  static freg cvt(ireg v) { return _mm256_cvtepi32_ps(v); }
  static freg fzero() { return _mm256_setzero_ps(); }
  static freg fload(const float* p) { return _mm256_loadu_ps(p); }
  // R f16 values widened (exact, F16C, as the decoders' half()).
  static freg fload_half(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void fstore(float* p, freg v) { _mm256_storeu_ps(p, v); }
  static freg fset1(float v) { return _mm256_set1_ps(v); }
  static freg fmul(freg a, freg b) { return _mm256_mul_ps(a, b); }
  static freg fadd(freg a, freg b) { return _mm256_add_ps(a, b); }
  static freg fma(freg a, freg b, freg c) { return _mm256_fmadd_ps(a, b, c); }
  static freg cvt_codes(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // codes [8][256] → out [count / 4][8][4]: an 8 x 8 transpose of dwords per 32 columns.
  static void interleave(const int8_t* codes, int64_t count, uint8_t* out) {
    for (int64_t c = 0; c < count; c += 32) {
      __m256i r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i * chunk_elements + c));
      __m256i t[8], u[8];
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      }
      for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
      }
      __m256i* dst = reinterpret_cast<__m256i*>(out + c * 8);  // group c / 4, 32 bytes each
      for (int m = 0; m < 4; ++m) {
        _mm256_storeu_si256(dst + m, _mm256_permute2x128_si256(u[m], u[4 + m], 0x20));
        _mm256_storeu_si256(dst + 4 + m, _mm256_permute2x128_si256(u[m], u[4 + m], 0x31));
      }
    }
  }

  static float absmax32(const float* x, bool* finite) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    __m256 unordered = _mm256_setzero_ps();
    for (int i = 0; i < 32; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float result = _mm_cvtss_f32(m);
    if (_mm256_movemask_ps(unordered) != 0 || result > std::numeric_limits<float>::max()) *finite = false;
    return result;
  }
  static void round32(const float* x, float d, int8_t* q, int32_t* sums) {
    const __m256 dv = _mm256_set1_ps(d);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i v[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + 8 * i), dv));
      v[i] = _mm256_min_epi32(_mm256_max_epi32(v[i], lo), hi);
    }
    for (int h = 0; h < 2; ++h) {
      __m256i s = _mm256_add_epi32(v[2 * h], v[2 * h + 1]);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      sums[h] += _mm_cvtsi128_si32(s4);
    }
    // int32 → int8 keeping the order: packs work within 128-bit lanes, the permute undoes that.
    const __m256i w01 = _mm256_packs_epi32(v[0], v[1]);
    const __m256i w23 = _mm256_packs_epi32(v[2], v[3]);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  }
};

}  // namespace

const quant_kernels& avx2_quant_kernels() {
  static const quant_kernels table = make_quant_kernels<avx2_qvec>();
  return table;
}

}  // namespace troupe::cpu
