// Attention kernels for AVX2 + FMA + F16C (this file is compiled with -mavx2 -mfma -mf16c and
// only called when the CPU reports those features).
#include <immintrin.h>

#include "backends/cpu/paged_attention_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx2_attention_vec {
  using reg = __m256;
  using mask = __m256;
  static constexpr int64_t width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static float half_to_float(uint16_t bits) { return _cvtsh_ss(bits); }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static reg load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // E4M3 → f16 bits, exact for every finite value (see the AVX-512 file), then × 2^8.
  static reg load_fp8(const uint8_t* p) {
    const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i magnitude = _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x7f)), 7);
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x80)), 8);
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(magnitude, sign)), _mm256_set1_ps(256.0f));
  }
  static void store_f16(uint16_t* p, reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // 32-bit lanes → their low 16 bits, in order.
  static __m128i narrow16(__m256i lanes) {
    const __m256i packed = _mm256_packus_epi32(lanes, lanes);  // per 128-bit half: 4 words, twice
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }
  static void store_bf16(uint16_t* p, reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256i chosen =
        _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow16(chosen));
  }
  static void store_bytes(uint8_t* p, __m256i lanes) {  // 32-bit lanes in [0, 255] → bytes
    const __m128i words = narrow16(lanes);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
  }
  static void store_i8(int8_t* p, reg v) {
    const __m128i words = narrow16(_mm256_and_si256(_mm256_cvtps_epi32(v), _mm256_set1_epi32(0xffff)));
    // words hold the int8 values sign-extended to 16 bits: pack with signed saturation.
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
  }
  static void store_fp8(uint8_t* p, reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(magnitude, 20), _mm256_set1_epi32(1));
    const __m256i normal = _mm256_sub_epi32(
        _mm256_srli_epi32(_mm256_add_epi32(magnitude, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7ffff))), 20),
        _mm256_set1_epi32(120 << 3));
    const __m256 absolute = _mm256_castsi256_ps(magnitude);
    const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(absolute, _mm256_set1_ps(512.0f)));
    const __m256 small = _mm256_cmp_ps(absolute, _mm256_set1_ps(0.015625f), _CMP_LT_OQ);
    __m256i code =
        _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(subnormal), small));
    code = _mm256_min_epi32(code, _mm256_set1_epi32(0x7e));
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    code = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(code), _mm256_castsi256_ps(_mm256_set1_epi32(0x7f)), nan));
    store_bytes(p, _mm256_or_si256(code, sign));
  }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg abs(reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static mask less(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static reg select(mask m, reg a, reg b) { return _mm256_blendv_ps(b, a, m); }
  static float sum_halving(reg v) {
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    four = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(four, _mm_movehdup_ps(four)));
  }
  static float reduce_max(reg v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  // As the AVX-512 version: 2^round(x) · Taylor series of 2^f, exactly 0 for x <= -127.
  static reg exp2(reg x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
    const reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm256_sub_ps(x, n);
    reg poly = _mm256_set1_ps(1.5252733804059840e-05f);
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.5403530393381609e-04f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.3333558146428443e-03f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(9.6181291076284772e-03f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(5.5504108664821580e-02f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(2.4022650695910071e-01f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(6.9314718055994531e-01f));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.0f));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(poly, _mm256_castsi256_ps(exponent));
  }
  // In place: lane j of v[i] becomes lane i of v[j]. Pairs of rows interleaved, then quads
  // within each 128-bit lane, then the two 128-bit lanes exchanged.
  static void transpose(reg* v) {
    reg t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    // u[4i + c], 128-bit lane L: element 4L + c of rows 4i .. 4i + 3.
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
};

}  // namespace

const attention_kernels& avx2_attention_kernels() {
  static const attention_kernels table = make_attention_kernels<avx2_attention_vec>();
  return table;
}

}  // namespace troupe::cpu
