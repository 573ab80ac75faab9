// Portable row kernels: one float at a time, for CPUs without AVX2 and as the tests' reference
// for the SIMD paths' structure.
#include "backends/cpu/fp8_row_kernels.hpp"
#include "backends/cpu/row_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct scalar_vec {
  using reg = float;
  static constexpr int pair_acts = 4;  // activation rows beside a tile of weight rows (registers)
  static constexpr int tile_rows = 2;  // weight rows per tile of the float dots
  static constexpr int64_t width = 1;
  static reg zero() { return 0.0f; }
  static reg load(const float* p) { return *p; }
  static reg load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static reg load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static reg load_q8(const int8_t* p) { return static_cast<float>(*p); }
  static reg set1(float v) { return v; }
  static reg add(reg a, reg b) { return a + b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static void store(float* p, reg v) { *p = v; }
  static float hsum(reg v) { return v; }
};

}  // namespace

const row_kernels& scalar_row_kernels() {
  static const row_kernels table = [] {
    row_kernels kernels = with_quant_to_f32(make_row_kernels<scalar_vec>(), scalar_quant_kernels());
    add_fp8_row_kernels_scalar(kernels);
    return kernels;
  }();
  return table;
}

const row_kernels& kernels_for(simd_level level) {
  switch (level) {
    case simd_level::avx512:
    case simd_level::avx512_vnni: return avx512_row_kernels();  // float kernels need no VNNI
    case simd_level::avx2: return avx2_row_kernels();
    case simd_level::scalar: break;
  }
  return scalar_row_kernels();
}

}  // namespace troupe::cpu
