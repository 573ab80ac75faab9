// Attention kernels for AVX-512 F/BW/VL/DQ (this file is compiled with those flags and only
// called when the CPU reports them).
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (a known header issue).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backends/cpu/paged_attention_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx512_attention_vec {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int64_t width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static float half_to_float(uint16_t bits) { return _cvtsh_ss(bits); }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static reg load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // E4M3 → f16 bits (sign to bit 15, exponent and mantissa shifted up by 7), exact as f16 for
  // every finite E4M3 value including subnormals; f16's bias is 8 more than E4M3's: × 2^8.
  static reg load_fp8(const uint8_t* p) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x7f)), 7);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(magnitude, sign)), _mm512_set1_ps(256.0f));
  }
  static void store_f16(uint16_t* p, reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_bf16(uint16_t* p, reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
  }
  static void store_i8(int8_t* p, reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  static void store_fp8(uint8_t* p, reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    // Normal: round the f32 mantissa to 3 bits (nearest even), rebias the exponent by 120.
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(magnitude, 20), _mm512_set1_epi32(1));
    const __m512i normal = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(magnitude, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7ffff))), 20),
        _mm512_set1_epi32(120 << 3));
    // Below 2^-6: a count of subnormal steps of 2^-9, to nearest even.
    const __m512 absolute = _mm512_castsi512_ps(magnitude);
    const __m512i subnormal = _mm512_cvtps_epi32(_mm512_mul_ps(absolute, _mm512_set1_ps(512.0f)));
    const __mmask16 small = _mm512_cmp_ps_mask(absolute, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    __m512i code = _mm512_min_epi32(_mm512_mask_blend_epi32(small, normal, subnormal), _mm512_set1_epi32(0x7e));
    code = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), code, _mm512_set1_epi32(0x7f));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign)));
  }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg abs(reg a) { return _mm512_abs_ps(a); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static mask less(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static reg select(mask m, reg a, reg b) { return _mm512_mask_blend_ps(m, b, a); }
  static float reduce_max(reg v) { return _mm512_reduce_max_ps(v); }
  static float sum_halving(reg v) {
    const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    four = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(four, _mm_movehdup_ps(four)));
  }
  // 2^x = 2^n · 2^f, n = round(x), f in [-1/2, 1/2]: Taylor series of e^(f ln 2) to degree 7
  // (relative error < 1e-8 before rounding). x <= -127 gives exactly 0.
  static reg exp2(reg x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    const reg n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm512_sub_ps(x, n);
    reg poly = _mm512_set1_ps(1.5252733804059840e-05f);
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.5403530393381609e-04f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.3333558146428443e-03f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(9.6181291076284772e-03f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(5.5504108664821580e-02f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(2.4022650695910071e-01f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(6.9314718055994531e-01f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
    const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(poly, _mm512_castsi512_ps(exponent));
  }
  // In place: lane j of v[i] becomes lane i of v[j]. Pairs of rows interleaved, then quads
  // within each 128-bit lane, then the 128-bit lanes gathered across four registers.
  static void transpose(reg* v) {
    reg t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    // u[4i + c], 128-bit lane L: element 4L + c of rows 4i .. 4i + 3.
    for (int i = 0; i < 16; i += 4) {
      u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
      u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; ++c) {
      const reg low_a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), high_a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
      const reg low_b = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44),
                high_b = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
      v[c] = _mm512_shuffle_f32x4(low_a, low_b, 0x88);
      v[4 + c] = _mm512_shuffle_f32x4(low_a, low_b, 0xdd);
      v[8 + c] = _mm512_shuffle_f32x4(high_a, high_b, 0x88);
      v[12 + c] = _mm512_shuffle_f32x4(high_a, high_b, 0xdd);
    }
  }
};

}  // namespace

const attention_kernels& avx512_attention_kernels() {
  static const attention_kernels table = make_attention_kernels<avx512_attention_vec>();
  return table;
}

}  // namespace troupe::cpu
