// Row kernels for AVX-512 F/BW/VL/DQ (this file is compiled with those flags and only called
// when the CPU reports them).
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (a known header issue).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backends/cpu/fp8_row_kernels.hpp"
#include "backends/cpu/row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct avx512_vec {
  using reg = __m512;
  static constexpr int pair_acts = 4;  // activation rows beside a tile of weight rows (registers)
  static constexpr int tile_rows = 3;  // weight rows per tile of the float dots
  static constexpr int64_t width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static reg load_q8(const int8_t* p) {
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
  }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

const row_kernels& avx512_row_kernels() {
  static const row_kernels table = [] {
    row_kernels kernels = with_quant_to_f32(make_row_kernels<avx512_vec>(), avx512_quant_kernels());
    add_fp8_row_kernels_avx512(kernels);
    return kernels;
  }();
  return table;
}

}  // namespace troupe::cpu
