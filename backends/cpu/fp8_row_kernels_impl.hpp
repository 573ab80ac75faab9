#pragma once
// The FP8 row kernels written once over a vector traits type and instantiated by each
// fp8_row_kernels_<level>.cpp with its own compiler flags (everything here has internal linkage).
//
// E4M3FN decodes through f16: its 7 magnitude bits shifted into f16's exponent and mantissa
// fields (and the sign into f16's) give an f16 worth exactly e4m3 / 2^8, subnormals included
// (E4M3's exponents -9..8 land inside f16's -24..15), which the CPU's f16 conversion turns into
// f32. The 2^8 is folded into the row's or block's factor, so no precision is lost.
//
// A traits type F provides: reg, width, zero(), load(const float*), load_e4m3(const uint8_t*)
// (width E4M3 values as f32, divided by 2^8), set1, add, mul, fma(a, b, c) = a*b + c,
// store(float*, reg), hsum(reg).

#include <cstdint>
#include <cstring>

#include "backends/cpu/fp8_row_kernels.hpp"
#include "model/half_float.hpp"

namespace troupe::cpu {
namespace {

constexpr float e4m3_unscale = 256.0f;  // undoes load_e4m3's division by 2^8
constexpr int64_t b128_block = 128;
constexpr int64_t b128_bytes = 4 + 128;  // [scale f32][128 x e4m3]

// The f16 bits worth e4m3(bits) / 2^8.
static inline uint16_t e4m3_as_f16_bits(uint8_t bits) {
  return static_cast<uint16_t>(((bits & 0x7f) << 7) | ((bits & 0x80) << 8));
}

static inline float e4m3_scalar(uint8_t bits) { return f16_to_f32(e4m3_as_f16_bits(bits)) * e4m3_unscale; }

// out[j] = dot(x_j, e4m3 row w) for N activation rows, two accumulators per row whatever N is
// (the same summation order alone or beside others: batch invariance, as the other kernels).
template <class F, int N>
inline void dot_tile_e4m3(const float* x, int64_t ldx, const uint8_t* w, int64_t k, float* out) {
  constexpr int64_t W = F::width;
  typename F::reg acc[N][2];
  for (int j = 0; j < N; ++j) acc[j][0] = acc[j][1] = F::zero();
  int64_t i = 0;
  for (; i + 2 * W <= k; i += 2 * W) {
    const typename F::reg w0 = F::load_e4m3(w + i);
    const typename F::reg w1 = F::load_e4m3(w + i + W);
    for (int j = 0; j < N; ++j) {
      acc[j][0] = F::fma(w0, F::load(x + j * ldx + i), acc[j][0]);
      acc[j][1] = F::fma(w1, F::load(x + j * ldx + i + W), acc[j][1]);
    }
  }
  for (; i + W <= k; i += W) {
    const typename F::reg w0 = F::load_e4m3(w + i);
    for (int j = 0; j < N; ++j) acc[j][0] = F::fma(w0, F::load(x + j * ldx + i), acc[j][0]);
  }
  float tail[N] = {};
  for (; i < k; ++i) {
    const float wi = e4m3_scalar(w[i]);
    for (int j = 0; j < N; ++j) tail[j] += wi * x[j * ldx + i];
  }
  for (int j = 0; j < N; ++j) out[j] = F::hsum(F::add(acc[j][0], acc[j][1])) * e4m3_unscale + tail[j];
}

// fp8_e4m3_b128: each block's dot is formed in two registers, then scaled into the row's sum.
template <class F, int N>
inline void dot_tile_b128(const float* x, int64_t ldx, const uint8_t* w, int64_t k, float* out) {
  constexpr int64_t W = F::width;
  typename F::reg acc[N];
  for (int j = 0; j < N; ++j) acc[j] = F::zero();
  for (int64_t b = 0; b < k / b128_block; ++b) {
    const uint8_t* block = w + b * b128_bytes;
    float scale;
    std::memcpy(&scale, block, 4);
    const typename F::reg factor = F::set1(scale * e4m3_unscale);
    const uint8_t* q = block + 4;
    const float* xb = x + b * b128_block;
    typename F::reg part[N][2];
    for (int j = 0; j < N; ++j) part[j][0] = part[j][1] = F::zero();
    for (int64_t c = 0; c < b128_block; c += 2 * W) {
      const typename F::reg w0 = F::load_e4m3(q + c);
      const typename F::reg w1 = F::load_e4m3(q + c + W);
      for (int j = 0; j < N; ++j) {
        part[j][0] = F::fma(w0, F::load(xb + j * ldx + c), part[j][0]);
        part[j][1] = F::fma(w1, F::load(xb + j * ldx + c + W), part[j][1]);
      }
    }
    for (int j = 0; j < N; ++j) acc[j] = F::fma(F::add(part[j][0], part[j][1]), factor, acc[j]);
  }
  for (int j = 0; j < N; ++j) out[j] = F::hsum(acc[j]);
}

template <class F, dtype T, int N>
inline void dot_tile_fp8(const float* x, int64_t ldx, const uint8_t* w, int64_t k, float* out) {
  if constexpr (T == dtype::fp8_e4m3) {
    dot_tile_e4m3<F, N>(x, ldx, w, k, out);
  } else {
    dot_tile_b128<F, N>(x, ldx, w, k, out);
  }
}

// y[j * ldy + r] = dot(x_j, row r) for j < n, r < num_rows; activation rows four at a time.
template <class F, dtype T>
void dot_rows_fp8(const float* x, int64_t n, int64_t ldx, const std::byte* w, int64_t k, int64_t num_rows, float* y,
                  int64_t ldy) {
  const size_t stride = row_bytes(T, k);
  float out[4];
  for (int64_t r = 0; r < num_rows; ++r) {
    const auto* row = reinterpret_cast<const uint8_t*>(w + r * stride);
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
      const float* xj = x + j0 * ldx;
      const int64_t count = n - j0 < 4 ? n - j0 : 4;
      switch (count) {
        case 1: dot_tile_fp8<F, T, 1>(xj, ldx, row, k, out); break;
        case 2: dot_tile_fp8<F, T, 2>(xj, ldx, row, k, out); break;
        case 3: dot_tile_fp8<F, T, 3>(xj, ldx, row, k, out); break;
        default: dot_tile_fp8<F, T, 4>(xj, ldx, row, k, out); break;
      }
      for (int64_t j = 0; j < count; ++j) y[(j0 + j) * ldy + r] = out[j];
    }
  }
}

template <class F>
void e4m3_to_f32_rows(const std::byte* src, int64_t count, float* dst) {
  const auto* q = reinterpret_cast<const uint8_t*>(src);
  const typename F::reg factor = F::set1(e4m3_unscale);
  int64_t i = 0;
  for (; i + F::width <= count; i += F::width) F::store(dst + i, F::mul(F::load_e4m3(q + i), factor));
  for (; i < count; ++i) dst[i] = e4m3_scalar(q[i]);
}

template <class F>
void b128_to_f32_rows(const std::byte* src, int64_t count, float* dst) {
  for (int64_t b = 0; b < count / b128_block; ++b) {
    const auto* block = reinterpret_cast<const uint8_t*>(src + b * b128_bytes);
    float scale;
    std::memcpy(&scale, block, 4);
    const typename F::reg factor = F::set1(scale * e4m3_unscale);
    for (int64_t c = 0; c < b128_block; c += F::width) {
      F::store(dst + b * b128_block + c, F::mul(F::load_e4m3(block + 4 + c), factor));
    }
  }
}

template <class F>
void add_fp8_row_kernels(row_kernels& table) {
  table.dot_rows[static_cast<int>(dtype::fp8_e4m3)] = &dot_rows_fp8<F, dtype::fp8_e4m3>;
  table.dot_rows[static_cast<int>(dtype::fp8_e4m3_b128)] = &dot_rows_fp8<F, dtype::fp8_e4m3_b128>;
  table.to_f32[static_cast<int>(dtype::fp8_e4m3)] = &e4m3_to_f32_rows<F>;
  table.to_f32[static_cast<int>(dtype::fp8_e4m3_b128)] = &b128_to_f32_rows<F>;
}

}  // namespace
}  // namespace troupe::cpu
