#include "backends/cpu/argmax.hpp"

#include <cstddef>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/simd_level.hpp"

namespace troupe {

namespace {

// Both passes (the maximum, then the first index holding it) go several floats at a time; what
// is left past the last full vector is done one by one. max_ps returns its second operand when
// either is NaN, so a NaN never replaces a maximum, like the scalar `v > best ? v : best`.

float scalar_max(const float* v, size_t begin, size_t n, float best) {
  for (size_t i = begin; i < n; ++i) best = v[i] > best ? v[i] : best;
  return best;
}

int32_t first_index_of(const float* v, size_t begin, size_t n, float best) {
  for (size_t i = begin; i < n; ++i) {
    if (v[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

#if defined(__x86_64__)
int32_t argmax_sse2(const float* v, size_t n) {
  float best = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  __m128 max0 = _mm_set1_ps(best), max1 = max0;
  for (; i + 8 <= n; i += 8) {
    max0 = _mm_max_ps(_mm_loadu_ps(v + i), max0);
    max1 = _mm_max_ps(_mm_loadu_ps(v + i + 4), max1);
  }
  alignas(16) float lanes[8];
  _mm_store_ps(lanes, max0);
  _mm_store_ps(lanes + 4, max1);
  best = scalar_max(v, i, n, scalar_max(lanes, 0, 8, best));
  const __m128 target = _mm_set1_ps(best);
  for (i = 0; i + 4 <= n; i += 4) {
    if (int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(v + i), target))) {
      return static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask))));
    }
  }
  return first_index_of(v, i, n, best);
}

// Twice the SSE2 width: about half the instructions on the worker's critical path.
__attribute__((target("avx2"))) int32_t argmax_avx2(const float* v, size_t n) {
  float best = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  __m256 max0 = _mm256_set1_ps(best), max1 = max0;
  for (; i + 16 <= n; i += 16) {
    max0 = _mm256_max_ps(_mm256_loadu_ps(v + i), max0);
    max1 = _mm256_max_ps(_mm256_loadu_ps(v + i + 8), max1);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, max0);
  _mm256_store_ps(lanes + 8, max1);
  best = scalar_max(v, i, n, scalar_max(lanes, 0, 16, best));
  const __m256 target = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    // Ordered, non-signalling equality: what _mm_cmpeq_ps and `==` compute.
    if (int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), target, _CMP_EQ_OQ))) {
      return static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask))));
    }
  }
  return first_index_of(v, i, n, best);
}

// Twice the AVX2 width again; the comparison gives a mask register directly. The max goes
// through the zero-masking form with every lane selected: GCC 12's plain _mm512_max_ps passes an
// "undefined" vector that -Wmaybe-uninitialized reports.
__attribute__((target("avx512f"))) int32_t argmax_avx512(const float* v, size_t n) {
  float best = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  constexpr __mmask16 all_lanes = 0xFFFF;
  __m512 max0 = _mm512_set1_ps(best), max1 = max0;
  for (; i + 32 <= n; i += 32) {
    max0 = _mm512_maskz_max_ps(all_lanes, _mm512_loadu_ps(v + i), max0);
    max1 = _mm512_maskz_max_ps(all_lanes, _mm512_loadu_ps(v + i + 16), max1);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_maskz_max_ps(all_lanes, max0, max1));
  best = scalar_max(v, i, n, scalar_max(lanes, 0, 16, best));
  const __m512 target = _mm512_set1_ps(best);
  for (i = 0; i + 16 <= n; i += 16) {
    if (__mmask16 mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), target, _CMP_EQ_OQ)) {
      return static_cast<int32_t>(i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask))));
    }
  }
  return first_index_of(v, i, n, best);
}
#endif

}  // namespace

int32_t argmax(std::span<const float> values) {
  const float* v = values.data();
  const size_t n = values.size();
#if defined(__x86_64__)
  // The CPU backend's level, so tests that force a level cover both paths. SSE2 is part of
  // x86-64 itself, so it serves the portable (scalar) level there.
  switch (cpu::active_simd_level()) {
    case cpu::simd_level::scalar: return argmax_sse2(v, n);
    case cpu::simd_level::avx2: return argmax_avx2(v, n);
    case cpu::simd_level::avx512:
    case cpu::simd_level::avx512_vnni: return argmax_avx512(v, n);
  }
  return argmax_sse2(v, n);
#else
  return first_index_of(v, 0, n, scalar_max(v, 0, n, -std::numeric_limits<float>::infinity()));
#endif
}

}  // namespace troupe
