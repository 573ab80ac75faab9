#pragma once
// Small pieces every reader of quantized blocks needs: little-endian fields, the lookup tables of
// the non-linear types, and the packed sub-block scales of the k-quants. The reference
// dequantizers (model/quant/*.cpp), the quantizer and the SIMD kernels all decode through these,
// so a layout is written down once.
//
// Everything is `static`: SIMD files compiled with -mavx2/-mavx512f include this too, and their
// copies must never be the ones a portable caller links against.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/half_float.hpp"

namespace troupe::quant {

static inline uint16_t read_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
static inline uint32_t read_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
static inline float read_f16(const std::byte* p) { return f16_to_f32(read_u16(p)); }
static inline void write_f16(std::byte* p, float value) {
  const uint16_t bits = f32_to_f16(value);
  std::memcpy(p, &bits, 2);
}
static inline const uint8_t* bytes_at(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }

// IQ4_NL / IQ4_XS: the 16 levels a 4-bit index selects (a non-uniform grid denser near zero,
// fitted to the distribution of trained weights), multiplied by the block's scale.
static constexpr int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// MXFP4: the 16 values of an E2M1 nibble (sign, 2-bit exponent, 1-bit mantissa), doubled so they
// are integers: 0, 0.5, 1, 1.5, 2, 3, 4, 6 become 0, 1, 2, 3, 4, 6, 8, 12. The block's E8M0
// exponent is then read as half its power of two (e8m0_half), which undoes the doubling.
static constexpr int8_t mxfp4_doubled_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 127) / 2 for an E8M0 exponent byte (e = 255, NaN in the OCP format, is read as a power
// of two like the others, as ggml does).
static inline float e8m0_half(uint8_t e) {
  // 2^(e - 128): a normal float for e >= 2, a subnormal for e = 0 and 1.
  const uint32_t bits = e < 2 ? (uint32_t{0x00200000} << e) : (static_cast<uint32_t>(e - 1) << 23);
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes. Sub-blocks 0-3 keep
// their scale and min in the low 6 bits of bytes 0-3 and 4-7; sub-blocks 4-7 keep their low 4
// bits in the nibbles of bytes 8-11 and their top 2 bits in the top 2 bits of bytes 0-7.
static inline void k_scale_min(int sub_block, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (sub_block < 4) {
    *scale = packed[sub_block] & 63;
    *min = packed[sub_block + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((packed[sub_block + 4] & 0x0f) | ((packed[sub_block - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((packed[sub_block + 4] >> 4) | ((packed[sub_block] >> 6) << 4));
  }
}

// Q3_K: sixteen 6-bit scales (stored with an offset of 32) packed in 12 bytes: the low 4 bits of
// scales 0-7 in the low nibbles of bytes 0-7, of scales 8-15 in their high nibbles; the top 2
// bits of scale j in bits 2*(j/4)..+1 of byte 8 + j%4.
static inline void q3_k_scales(const uint8_t* packed, int8_t* scales /* [16] */) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (packed[j] & 0x0f) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    scales[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// IQ4_XS: the 6-bit scale (minus 32) of sub-block `sub_block` (0..7): its low 4 bits are a nibble
// of scales_l (4 bytes at offset 4), its top 2 bits a pair of scales_h (u16 at offset 2).
static inline int iq4_xs_sub_scale(const std::byte* block, int sub_block) {
  const uint16_t scales_h = read_u16(block + 2);
  const uint8_t* scales_l = bytes_at(block + 4);
  const int low = (scales_l[sub_block / 2] >> (4 * (sub_block % 2))) & 0x0f;
  const int high = (scales_h >> (2 * sub_block)) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace troupe::quant
