// FP8 row kernels, one float at a time: for CPUs without AVX2, and the structure the SIMD
// levels share.
#include "backends/cpu/fp8_row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct scalar_fp8 {
  using reg = float;
  static constexpr int64_t width = 1;
  static reg zero() { return 0.0f; }
  static reg load(const float* p) { return *p; }
  static reg load_e4m3(const uint8_t* p) { return f16_to_f32(e4m3_as_f16_bits(*p)); }
  static reg set1(float v) { return v; }
  static reg add(reg a, reg b) { return a + b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static void store(float* p, reg v) { *p = v; }
  static float hsum(reg v) { return v; }
};

}  // namespace

void add_fp8_row_kernels_scalar(row_kernels& table) { add_fp8_row_kernels<scalar_fp8>(table); }

}  // namespace troupe::cpu
