// Portable integer kernels: one weight row per "lane", signed products, std::fma for the f32
// steps (so every SIMD level's results equal these bit for bit), and the run-time choice of
// table.
#include <algorithm>
#include <cmath>

#include "backends/cpu/quant_kernels_impl.hpp"

namespace troupe::cpu {
namespace {

struct scalar_qvec {
  static constexpr int R = 1;
  static constexpr bool vnni = false;
  static constexpr int act_rows = 4;
  using ireg = int32_t;
  using wreg = uint32_t;  // 4 signed codes of the one row
  using freg = float;

  static ireg izero() { return 0; }
  static wreg load_w(const uint8_t* p) {
    wreg v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static ireg dot4(ireg acc, wreg w, int32_t a4) {
    int8_t wb[4], ab[4];
    std::memcpy(wb, &w, 4);
    std::memcpy(ab, &a4, 4);
    for (int i = 0; i < 4; ++i) acc += int32_t{wb[i]} * int32_t{ab[i]};
    return acc;
  }
  static wreg abs8(wreg w) { return w; }  // unused: the scalar level multiplies signed codes
  static ireg dot4_signed(ireg acc, wreg w, wreg, int32_t a4) { return dot4(acc, w, a4); }
  static ireg isub(ireg acc, int32_t v) { return acc - v; }
  static freg cvt(ireg v) { return static_cast<float>(v); }
  static freg fzero() { return 0.0f; }
  static freg fload(const float* p) { return *p; }
  static void fstore(float* p, freg v) { *p = v; }
  static freg fset1(float v) { return v; }
  static freg fmul(freg a, freg b) { return a * b; }
  static freg fadd(freg a, freg b) { return a + b; }
  static freg fma(freg a, freg b, freg c) { return std::fma(a, b, c); }
  static freg cvt_codes(const int8_t* p) { return static_cast<float>(*p); }
  static void interleave(const int8_t* codes, int64_t count, uint8_t* out) {
    std::memcpy(out, codes, static_cast<size_t>(count));  // one row: already in order
  }
  static float absmax32(const float* x, bool* finite) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (!std::isfinite(x[i])) *finite = false;
      amax = std::max(amax, std::fabs(x[i]));
    }
    return amax;
  }
  // The decoders' byte operations (see quant_bytes_x86.hpp), one byte at a time.
  static void nibbles32(const uint8_t* src, int8_t add, int8_t* out) {
    for (int i = 0; i < 16; ++i) {
      out[i] = static_cast<int8_t>((src[i] & 0x0f) + add);
      out[i + 16] = static_cast<int8_t>((src[i] >> 4) + add);
    }
  }
  static void field32(const uint8_t* src, int shift, uint8_t mask, int8_t add, int8_t* out) {
    for (int i = 0; i < 32; ++i) out[i] = static_cast<int8_t>(((src[i] >> shift) & mask) + add);
  }
  static void add_field32(const uint8_t* src, int shift, uint8_t mask, int up, int8_t* out) {
    for (int i = 0; i < 32; ++i) out[i] = static_cast<int8_t>(out[i] + (((src[i] >> shift) & mask) << up));
  }
  static void add_bits32(uint32_t bits, int8_t value, int8_t* out) {
    for (int i = 0; i < 32; ++i) {
      if ((bits >> i) & 1) out[i] = static_cast<int8_t>(out[i] + value);
    }
  }
  static void lookup(const int8_t* table, int8_t* codes, int count) {
    for (int i = 0; i < count; ++i) codes[i] = table[codes[i] & 0x0f];
  }
  static void add_bytes(int8_t* codes, int count, int8_t value) {
    for (int i = 0; i < count; ++i) codes[i] = static_cast<int8_t>(codes[i] + value);
  }
  static float half(uint16_t bits) { return f16_to_f32(bits); }

  static void round32(const float* x, float d, int8_t* q, int32_t* sums) {
    for (int i = 0; i < 32; ++i) {
      const float v = std::nearbyint(x[i] / d);
      const int32_t qi = static_cast<int32_t>(std::clamp(v, -127.0f, 127.0f));
      q[i] = static_cast<int8_t>(qi);
      sums[i / 16] += qi;
    }
  }
};

}  // namespace

const quant_kernels& scalar_quant_kernels() {
  static const quant_kernels table = make_quant_kernels<scalar_qvec>();
  return table;
}

const quant_kernels& quant_kernels_for(simd_level level) {
  switch (level) {
    case simd_level::avx512_vnni: return avx512_vnni_quant_kernels();
    case simd_level::avx512: return avx512_quant_kernels();
    case simd_level::avx2: return avx2_quant_kernels();
    case simd_level::scalar: break;
  }
  return scalar_quant_kernels();
}

}  // namespace troupe::cpu
