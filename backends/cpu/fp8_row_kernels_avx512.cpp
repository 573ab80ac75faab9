// FP8 row kernels for AVX-512 F/BW/VL/DQ (compiled with those flags; called only when the CPU
// reports them).
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (a known header issue).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backends/cpu/fp8_row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx512_fp8 {
  using reg = __m512;
  static constexpr int64_t width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  // 16 E4M3 bytes -> 16 u16 -> f16 bits (magnitude << 7, sign << 8) -> f32.
  static reg load_e4m3(const uint8_t* p) {
    const __m256i wide = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(wide, _mm256_set1_epi16(0x7f)), 7);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(wide, _mm256_set1_epi16(0x80)), 8);
    return _mm512_cvtph_ps(_mm256_or_si256(magnitude, sign));
  }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

void add_fp8_row_kernels_avx512(row_kernels& table) { add_fp8_row_kernels<avx512_fp8>(table); }

}  // namespace troupe::cpu
