// FP8 row kernels for AVX2 + FMA + F16C (compiled with those flags; called only when the CPU
// reports them).
#include <immintrin.h>

#include "backends/cpu/fp8_row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx2_fp8 {
  using reg = __m256;
  static constexpr int64_t width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  // 8 E4M3 bytes -> 8 u16 -> f16 bits (magnitude << 7, sign << 8) -> f32.
  static reg load_e4m3(const uint8_t* p) {
    const __m128i wide = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i magnitude = _mm_slli_epi16(_mm_and_si128(wide, _mm_set1_epi16(0x7f)), 7);
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(wide, _mm_set1_epi16(0x80)), 8);
    return _mm256_cvtph_ps(_mm_or_si128(magnitude, sign));
  }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static float hsum(reg v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
  }
};

}  // namespace

void add_fp8_row_kernels_avx2(row_kernels& table) { add_fp8_row_kernels<avx2_fp8>(table); }

}  // namespace troupe::cpu
