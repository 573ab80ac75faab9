// Portable attention kernels: one float at a time, for CPUs without AVX2.
#include <cmath>

#include "backends/cpu/paged_attention_kernels_impl.hpp"
#include "model/quant/fp8.hpp"

namespace troupe::cpu {
namespace {

struct scalar_attention_vec {
  using reg = float;
  using mask = bool;
  static constexpr int64_t width = 1;
  static reg zero() { return 0.0f; }
  static float half_to_float(uint16_t bits) { return f16_to_f32(bits); }
  static reg set1(float v) { return v; }
  static reg load(const float* p) { return *p; }
  static void store(float* p, reg v) { *p = v; }
  static reg load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static reg load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static reg load_i8(const int8_t* p) { return static_cast<float>(*p); }
  static reg load_fp8(const uint8_t* p) { return quant::fp8_e4m3_to_f32(*p); }
  static void store_f16(uint16_t* p, reg v) { *p = f32_to_f16(v); }
  static void store_bf16(uint16_t* p, reg v) { *p = f32_to_bf16(v); }
  static void store_i8(int8_t* p, reg v) { *p = static_cast<int8_t>(std::nearbyint(v)); }
  static void store_fp8(uint8_t* p, reg v) { *p = quant::f32_to_fp8_e4m3(v); }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg abs(reg a) { return std::fabs(a); }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static mask less(reg a, reg b) { return a < b; }
  static reg select(mask m, reg a, reg b) { return m ? a : b; }
  static float reduce_max(reg v) { return v; }
  static float sum_halving(reg v) { return v; }
  static reg exp2(reg x) { return x <= -127.0f ? 0.0f : std::exp2(x); }
  static void transpose(reg*) {}  // one lane: nothing to move
};

}  // namespace

const attention_kernels& scalar_attention_kernels() {
  static const attention_kernels table = make_attention_kernels<scalar_attention_vec>();
  return table;
}

const attention_kernels& attention_kernels_for(simd_level level) {
  switch (level) {
    case simd_level::avx512_vnni:  // attention has no int8 products: VNNI adds nothing
    case simd_level::avx512: return avx512_attention_kernels();
    case simd_level::avx2: return avx2_attention_kernels();
    case simd_level::scalar: break;
  }
  return scalar_attention_kernels();
}

}  // namespace troupe::cpu
