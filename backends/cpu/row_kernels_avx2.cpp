// Row kernels for AVX2 + FMA + F16C (this file is compiled with -mavx2 -mfma -mf16c and only
// called when the CPU reports those features).
#include <immintrin.h>

#include "backends/cpu/fp8_row_kernels.hpp"
#include "backends/cpu/row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx2_vec {
  using reg = __m256;
  static constexpr int pair_acts = 2;  // activation rows beside a tile of weight rows (registers)
  static constexpr int tile_rows = 2;  // weight rows per tile of the float dots
  static constexpr int64_t width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static reg load_q8(const int8_t* p) {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
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

const row_kernels& avx2_row_kernels() {
  static const row_kernels table = [] {
    row_kernels kernels = with_quant_to_f32(make_row_kernels<avx2_vec>(), avx2_quant_kernels());
    add_fp8_row_kernels_avx2(kernels);
    return kernels;
  }();
  return table;
}

}  // namespace troupe::cpu
