#pragma once
// The quantized weight types, block by block, for the CUDA kernels: one decoder per type that
// turns a "part" of a block into floats in registers. The GEMV (quant_gemv.cuh), the row
// dequantizer (dequantize_rows.cuh) and the embedding gather all decode through these, so each
// layout is written down once on the device side; model/quant/ is the reference they are tested
// against bit for bit (tests/backends/cuda/quant_blocks_test.cpp runs these same functions on
// the host, where no GPU is needed).
//
// A decoder splits a block into `parts` equal parts (one per thread of a warp that shares the
// block), each `runs` runs of 8 consecutive elements: part p's value i * 8 + j is element
// run_start(p, i) + j of the block. Runs of 8 let a thread fetch the matching activations with
// one 16-byte load (two for f32), whatever the type's interleaving of low and high bits.
//
// Every value is computed with the float operations of the reference dequantizer, in its order,
// rounded the same way (no fused multiply-add): the kernels see exactly the weights the CPU sees.
//
// Written for both compilers: nvcc's device pass takes the intrinsics, the host pass and g++
// take portable code that computes the same bits (the host tests run it).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/dtype.hpp"
#include "model/half_float.hpp"

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__ __forceinline__
#define TROUPE_HOST_DEVICE_CONSTEXPR __host__ __device__ constexpr
#define TROUPE_UNROLL _Pragma("unroll")
#else
#define TROUPE_HOST_DEVICE inline
#define TROUPE_HOST_DEVICE_CONSTEXPR constexpr
#define TROUPE_UNROLL
#endif

namespace troupe::cuda::quant_blocks {

// ---- loads and bit tricks ----

// The alignment (bytes) of a field at `offset + k * step` in a block aligned to `block_align`:
// the lowest power of two dividing all three (step 0: no runtime part).
TROUPE_HOST_DEVICE_CONSTEXPR int field_align(int block_align, int offset, int step = 0) {
  int align = block_align;
  while (align > 1 && ((offset % align) != 0 || (step != 0 && step % align != 0))) align /= 2;
  return align;
}

// words[0 .. N) = the 4 * N bytes at p (little-endian), read with the widest loads that an
// address aligned to `Align` bytes allows. The host path checks the alignment it is promised, so
// the host tests catch a wrong promise before it becomes a misaligned access on a GPU.
template <int N, int Align>
TROUPE_HOST_DEVICE void load_words(const std::byte* p, uint32_t (&words)[N]) {
#if defined(__CUDA_ARCH__)
  if constexpr (Align >= 16 && N % 4 == 0) {
TROUPE_UNROLL
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      words[4 * i] = v.x, words[4 * i + 1] = v.y, words[4 * i + 2] = v.z, words[4 * i + 3] = v.w;
    }
  } else if constexpr (Align >= 8 && N % 2 == 0) {
TROUPE_UNROLL
    for (int i = 0; i < N / 2; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      words[2 * i] = v.x, words[2 * i + 1] = v.y;
    }
  } else if constexpr (Align >= 4) {
TROUPE_UNROLL
    for (int i = 0; i < N; ++i) words[i] = reinterpret_cast<const uint32_t*>(p)[i];
  } else if constexpr (Align >= 2) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
TROUPE_UNROLL
    for (int i = 0; i < N; ++i) words[i] = static_cast<uint32_t>(h[2 * i]) | (static_cast<uint32_t>(h[2 * i + 1]) << 16);
  } else {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
TROUPE_UNROLL
    for (int i = 0; i < N; ++i) {
      words[i] = static_cast<uint32_t>(b[4 * i]) | (static_cast<uint32_t>(b[4 * i + 1]) << 8) |
                 (static_cast<uint32_t>(b[4 * i + 2]) << 16) | (static_cast<uint32_t>(b[4 * i + 3]) << 24);
    }
  }
#else
  if (reinterpret_cast<uintptr_t>(p) % Align != 0) {
    throw std::logic_error("quant_blocks: a load promised " + std::to_string(Align) + "-byte alignment got address " +
                           std::to_string(reinterpret_cast<uintptr_t>(p)));
  }
  std::memcpy(words, p, 4 * N);
#endif
}

template <int Align>
TROUPE_HOST_DEVICE uint32_t load_u16(const std::byte* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (Align >= 2) {
    return *reinterpret_cast<const uint16_t*>(p);
  } else {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
    return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8);
  }
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

TROUPE_HOST_DEVICE uint32_t load_u8(const std::byte* p) { return static_cast<uint32_t>(*reinterpret_cast<const uint8_t*>(p)); }

TROUPE_HOST_DEVICE float bits_as_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

// The IEEE half with bits `bits` as a float (exact).
TROUPE_HOST_DEVICE float half_bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#else
  return f16_to_f32(static_cast<uint16_t>(bits));
#endif
}

// Products and sums rounded on their own, never fused, as the reference computes them.
TROUPE_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TROUPE_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TROUPE_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Byte `n` of x:y (bytes 0-3 of x, then 4-7 of y) for each selector nibble of `s` (3 bits used).
TROUPE_HOST_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t both = static_cast<uint64_t>(x) | (static_cast<uint64_t>(y) << 32);
  uint32_t result = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t select = (s >> (4 * n)) & 7;
    result |= static_cast<uint32_t>((both >> (8 * select)) & 0xff) << (8 * n);
  }
  return result;
#endif
}

// (byte n of v) - Offset as a float, exactly. On the device without an integer-to-float
// conversion (a quarter-rate instruction that would cap a 4-bit GEMV below the memory roof): the
// byte becomes the low mantissa bits of 2^23, and one subtraction removes 2^23 + Offset.
template <int Offset, int N>
TROUPE_HOST_DEVICE float byte_value(uint32_t v) {
  static_assert(N >= 0 && N < 4, "a word has bytes 0..3");
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7540u | N)) - (8388608.0f + static_cast<float>(Offset));
#else
  return static_cast<float>(static_cast<int>((v >> (8 * N)) & 0xffu) - Offset);
#endif
}

// The signed byte n of v as a float.
template <int N>
TROUPE_HOST_DEVICE float signed_byte_value(uint32_t v) {
  return byte_value<128, N>(v ^ 0x80808080u);  // int8 b is the unsigned byte (b ^ 0x80) - 128
}

constexpr uint32_t pack_levels(int a, int b, int c, int d) {
  return static_cast<uint32_t>(static_cast<uint8_t>(a)) | (static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8) |
         (static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16) | (static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24);
}

// 16-entry tables of int8 levels, packed four to a word (entry i in byte i % 4 of word i / 4).
// Scalar constants, which device code may read (an array or class object it could not).
// IQ4_NL / IQ4_XS levels (model/quant/block_fields.hpp: iq4_levels).
struct iq4_levels {
  static constexpr uint32_t w0 = pack_levels(-127, -104, -83, -65), w1 = pack_levels(-49, -35, -22, -10),
                            w2 = pack_levels(1, 13, 25, 38), w3 = pack_levels(53, 69, 89, 113);
};
// MXFP4's E2M1 values doubled (block_fields.hpp: mxfp4_doubled_levels).
struct mxfp4_levels {
  static constexpr uint32_t w0 = pack_levels(0, 1, 2, 3), w1 = pack_levels(4, 6, 8, 12),
                            w2 = pack_levels(0, -1, -2, -3), w3 = pack_levels(-4, -6, -8, -12);
};

// The levels of the four indices (0..15) held in the bytes of `indices`, as four int8 bytes:
// two byte permutes pick from entries 0-7 and 8-15, bit 3 of each index chooses between them.
template <class Table>
TROUPE_HOST_DEVICE uint32_t lookup4(uint32_t indices) {
  const uint32_t low3 = indices & 0x07070707u;
  const uint32_t selector = (low3 & 0xfu) | ((low3 >> 4) & 0xf0u) | ((low3 >> 8) & 0xf00u) | ((low3 >> 12) & 0xf000u);
  const uint32_t from_low = byte_perm(Table::w0, Table::w1, selector);
  const uint32_t from_high = byte_perm(Table::w2, Table::w3, selector);
  const uint32_t high = ((indices >> 3) & 0x01010101u) * 0xffu;  // 0xff in each byte whose index is >= 8
  return (from_low & ~high) | (from_high & high);
}

// 2^(e - 128) for an E8M0 byte: half its power of two (block_fields.hpp: e8m0_half).
TROUPE_HOST_DEVICE float e8m0_half(uint32_t e) {
  return bits_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes held in
// `packed` (3 words) (block_fields.hpp: k_scale_min).
TROUPE_HOST_DEVICE void k_scale_min(const uint32_t (&packed)[3], int j, float* scale, float* min) {
  auto byte = [&](int i) { return (packed[i / 4] >> (8 * (i % 4))) & 0xffu; };
  uint32_t sc, m;
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0x0f) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
  *scale = static_cast<float>(static_cast<int>(sc));
  *min = static_cast<float>(static_cast<int>(m));
}

// Q3_K: the 6-bit scale (minus 32) of sub-block j (0..15) (block_fields.hpp: q3_k_scales).
TROUPE_HOST_DEVICE float q3_k_scale(const uint32_t (&packed)[3], int j) {
  auto byte = [&](int i) { return (packed[i / 4] >> (8 * (i % 4))) & 0xffu; };
  const uint32_t low = j < 8 ? (byte(j) & 0x0f) : (byte(j - 8) >> 4);
  const uint32_t high = (byte(8 + j % 4) >> (2 * (j / 4))) & 3;
  return static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
}

// ---- the legacy types: blocks of 32 ----
//
// Two parts a block: part p holds bytes 8p..8p+7 of the 16 quant bytes, i.e. elements 8p..8p+7
// (low nibbles) and 16+8p..16+8p+7 (high nibbles). Q8_0's part p is elements 16p..16p+15.

// The 16 values of bytes q[0..1] (8 bytes): out[0..7] from the low nibbles, out[8..15] from the
// high nibbles, each through `value(nibble as float)`.
template <int Offset, class Value>
TROUPE_HOST_DEVICE void split_nibbles(const uint32_t (&q)[2], float (&out)[16], Value value) {
TROUPE_UNROLL
  for (int w = 0; w < 2; ++w) {
    const uint32_t low = q[w] & 0x0f0f0f0fu, high = (q[w] >> 4) & 0x0f0f0f0fu;
    out[4 * w + 0] = value(byte_value<Offset, 0>(low));
    out[4 * w + 1] = value(byte_value<Offset, 1>(low));
    out[4 * w + 2] = value(byte_value<Offset, 2>(low));
    out[4 * w + 3] = value(byte_value<Offset, 3>(low));
    out[8 + 4 * w + 0] = value(byte_value<Offset, 0>(high));
    out[8 + 4 * w + 1] = value(byte_value<Offset, 1>(high));
    out[8 + 4 * w + 2] = value(byte_value<Offset, 2>(high));
    out[8 + 4 * w + 3] = value(byte_value<Offset, 3>(high));
  }
}

struct q4_0_block {
  static constexpr dtype type = dtype::q4_0;
  static constexpr int size = 32, bytes = 18, align = 2, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    uint32_t q[2];
    load_words<2, field_align(align, 2, 8)>(block + 2 + 8 * part, q);
    split_nibbles<8>(q, out, [d](float v) { return mul_rn(d, v); });
  }
};

struct q4_1_block {
  static constexpr dtype type = dtype::q4_1;
  static constexpr int size = 32, bytes = 20, align = 4, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    const float m = half_bits_to_float(load_u16<2>(block + 2));
    uint32_t q[2];
    load_words<2, field_align(align, 4, 8)>(block + 4 + 8 * part, q);
    split_nibbles<0>(q, out, [d, m](float v) { return add_rn(mul_rn(d, v), m); });
  }
};

// Q5_0 / Q5_1: bit j of the 32-bit qh is the 5th bit of element j. Adds 16 to out[i] where
// element run_start(part, i / 8) + i % 8 has its bit set.
TROUPE_HOST_DEVICE void add_fifth_bits(uint32_t qh, int part, float (&q)[16]) {
  const uint32_t low_bits = qh >> (8 * part), high_bits = qh >> (16 + 8 * part);
TROUPE_UNROLL
  for (int j = 0; j < 8; ++j) {
    q[j] += static_cast<float>(((low_bits >> j) & 1u) << 4);
    q[8 + j] += static_cast<float>(((high_bits >> j) & 1u) << 4);
  }
}

struct q5_0_block {
  static constexpr dtype type = dtype::q5_0;
  static constexpr int size = 32, bytes = 22, align = 2, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    uint32_t qh[1], q[2];
    load_words<1, field_align(align, 2)>(block + 2, qh);
    load_words<2, field_align(align, 6, 8)>(block + 6 + 8 * part, q);
    split_nibbles<0>(q, out, [](float v) { return v; });
    add_fifth_bits(qh[0], part, out);
TROUPE_UNROLL
    for (int i = 0; i < 16; ++i) out[i] = mul_rn(d, out[i] - 16.0f);  // small integers: exact
  }
};

struct q5_1_block {
  static constexpr dtype type = dtype::q5_1;
  static constexpr int size = 32, bytes = 24, align = 8, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    const float m = half_bits_to_float(load_u16<2>(block + 2));
    uint32_t qh[1], q[2];
    load_words<1, field_align(align, 4)>(block + 4, qh);
    load_words<2, field_align(align, 8, 8)>(block + 8 + 8 * part, q);
    split_nibbles<0>(q, out, [](float v) { return v; });
    add_fifth_bits(qh[0], part, out);
TROUPE_UNROLL
    for (int i = 0; i < 16; ++i) out[i] = add_rn(mul_rn(d, out[i]), m);
  }
};

struct q8_0_block {
  static constexpr dtype type = dtype::q8_0;
  static constexpr int size = 32, bytes = 34, align = 2, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 16 * part + 8 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    uint32_t q[4];
    load_words<4, field_align(align, 2, 16)>(block + 2 + 16 * part, q);
TROUPE_UNROLL
    for (int w = 0; w < 4; ++w) {
      out[4 * w + 0] = mul_rn(d, signed_byte_value<0>(q[w]));
      out[4 * w + 1] = mul_rn(d, signed_byte_value<1>(q[w]));
      out[4 * w + 2] = mul_rn(d, signed_byte_value<2>(q[w]));
      out[4 * w + 3] = mul_rn(d, signed_byte_value<3>(q[w]));
    }
  }
};

// The 16 levels that the nibbles of q[0..1] select from `table`: out[0..7] from the low nibbles,
// out[8..15] from the high ones, each times `scale` (level first: MXFP4's reference order; for
// IQ4 the product is the same).
template <class Table, bool LevelFirst>
TROUPE_HOST_DEVICE void table_nibbles(const uint32_t (&q)[2], float scale, float (&out)[16]) {
TROUPE_UNROLL
  for (int w = 0; w < 2; ++w) {
    const uint32_t low = lookup4<Table>(q[w] & 0x0f0f0f0fu), high = lookup4<Table>((q[w] >> 4) & 0x0f0f0f0fu);
    const float levels[8] = {signed_byte_value<0>(low),  signed_byte_value<1>(low),  signed_byte_value<2>(low),
                             signed_byte_value<3>(low),  signed_byte_value<0>(high), signed_byte_value<1>(high),
                             signed_byte_value<2>(high), signed_byte_value<3>(high)};
TROUPE_UNROLL
    for (int n = 0; n < 4; ++n) {
      out[4 * w + n] = LevelFirst ? mul_rn(levels[n], scale) : mul_rn(scale, levels[n]);
      out[8 + 4 * w + n] = LevelFirst ? mul_rn(levels[4 + n], scale) : mul_rn(scale, levels[4 + n]);
    }
  }
}

struct iq4_nl_block {
  static constexpr dtype type = dtype::iq4_nl;
  static constexpr int size = 32, bytes = 18, align = 2, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = half_bits_to_float(load_u16<align>(block));
    uint32_t q[2];
    load_words<2, field_align(align, 2, 8)>(block + 2 + 8 * part, q);
    table_nibbles<iq4_levels, false>(q, d, out);
  }
};

struct mxfp4_block {
  static constexpr dtype type = dtype::mxfp4;
  static constexpr int size = 32, bytes = 17, align = 1, parts = 2, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const float d = e8m0_half(load_u8(block));
    uint32_t q[2];
    load_words<2, 1>(block + 1 + 8 * part, q);
    table_nibbles<mxfp4_levels, true>(q, d, out);
  }
};

// ---- the k-quants: super-blocks of 256 ----

// Q4_K: 16 parts. The quants come in 4 groups of 32 bytes, group g holding elements 64g..64g+31
// in its low nibbles (sub-block 2g) and 64g+32..64g+63 in its high nibbles (sub-block 2g + 1).
// Part p takes bytes 8(p%4)..+7 of group p/4.
struct q4_k_block {
  static constexpr dtype type = dtype::q4_k;
  static constexpr int size = 256, bytes = 144, align = 16, parts = 16, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 64 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const int group = part / 4;
    uint32_t head[4];  // d, dmin, and the first 12 bytes of packed scales
    load_words<4, align>(block, head);
    const float d = half_bits_to_float(head[0] & 0xffffu), dmin = half_bits_to_float(head[0] >> 16);
    const uint32_t packed[3] = {head[1], head[2], head[3]};
    float sc, m;
    k_scale_min(packed, 2 * group, &sc, &m);
    const float d1 = mul_rn(d, sc), m1 = mul_rn(dmin, m);
    k_scale_min(packed, 2 * group + 1, &sc, &m);
    const float d2 = mul_rn(d, sc), m2 = mul_rn(dmin, m);
    uint32_t q[2];
    load_words<2, field_align(align, 16, 8)>(block + 16 + 32 * group + 8 * (part % 4), q);
    split_nibbles<0>(q, out, [](float v) { return v; });
TROUPE_UNROLL
    for (int j = 0; j < 8; ++j) {
      out[j] = sub_rn(mul_rn(d1, out[j]), m1);
      out[8 + j] = sub_rn(mul_rn(d2, out[8 + j]), m2);
    }
  }
};

// Q5_K: Q4_K's layout plus a 5th bit: element 64g + l (l < 32) takes bit 2g of qh[l], element
// 64g + 32 + l bit 2g + 1.
struct q5_k_block {
  static constexpr dtype type = dtype::q5_k;
  static constexpr int size = 256, bytes = 176, align = 16, parts = 16, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 64 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const int group = part / 4, chunk = part % 4;
    uint32_t head[4];
    load_words<4, align>(block, head);
    const float d = half_bits_to_float(head[0] & 0xffffu), dmin = half_bits_to_float(head[0] >> 16);
    const uint32_t packed[3] = {head[1], head[2], head[3]};
    float sc, m;
    k_scale_min(packed, 2 * group, &sc, &m);
    const float d1 = mul_rn(d, sc), m1 = mul_rn(dmin, m);
    k_scale_min(packed, 2 * group + 1, &sc, &m);
    const float d2 = mul_rn(d, sc), m2 = mul_rn(dmin, m);
    uint32_t qh[2], q[2];
    load_words<2, field_align(align, 16, 8)>(block + 16 + 8 * chunk, qh);
    load_words<2, field_align(align, 48, 8)>(block + 48 + 32 * group + 8 * chunk, q);
    split_nibbles<0>(q, out, [](float v) { return v; });
TROUPE_UNROLL
    for (int j = 0; j < 8; ++j) {
      const uint32_t h = (qh[j / 4] >> (8 * (j % 4))) >> (2 * group);
      const float low = out[j] + static_cast<float>((h & 1u) << 4);
      const float high = out[8 + j] + static_cast<float>(((h >> 1) & 1u) << 4);
      out[j] = sub_rn(mul_rn(d1, low), m1);
      out[8 + j] = sub_rn(mul_rn(d2, high), m2);
    }
  }
};

// Q6_K: 8 parts. Each half h of 128 elements uses 64 bytes of ql, 32 of qh and 8 scales; part p
// takes bytes l0..l0+7 (l0 = 8(p%4)) of ql, of ql + 32 and of qh in half p/4, which hold elements
// l0 + j + 32k (k = 0..3) of the half: ql low / ql+32 low / ql high / ql+32 high nibbles, with
// bits 2k..2k+1 of qh on top; element e of the half has scale sc[8h + e / 16].
struct q6_k_block {
  static constexpr dtype type = dtype::q6_k;
  static constexpr int size = 256, bytes = 210, align = 2, parts = 8, runs = 4;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[32]) {
    const int half = part / 4, chunk = part % 4;
    const float d = half_bits_to_float(load_u16<2>(block + 208));
    uint32_t a[2], b[2], h[2], scales[2];
    load_words<2, field_align(align, 0, 8)>(block + 64 * half + 8 * chunk, a);
    load_words<2, field_align(align, 32, 8)>(block + 64 * half + 32 + 8 * chunk, b);
    load_words<2, field_align(align, 128, 8)>(block + 128 + 32 * half + 8 * chunk, h);
    load_words<2, field_align(align, 192, 8)>(block + 192 + 8 * half, scales);
    // Elements l0 + j + 32k have scale index (l0 + 32k) / 16 = chunk / 2 + 2k within the half.
    float ds[4];
TROUPE_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int index = chunk / 2 + 2 * k;
      const int8_t sc = static_cast<int8_t>((scales[index / 4] >> (8 * (index % 4))) & 0xffu);
      ds[k] = mul_rn(d, static_cast<float>(sc));
    }
TROUPE_UNROLL
    for (int w = 0; w < 2; ++w) {
TROUPE_UNROLL
      for (int n = 0; n < 4; ++n) {
        const uint32_t qa = (a[w] >> (8 * n)) & 0xffu, qb = (b[w] >> (8 * n)) & 0xffu, qh = (h[w] >> (8 * n)) & 0xffu;
        const int q0 = static_cast<int>((qa & 0x0f) | ((qh & 3) << 4)) - 32;
        const int q1 = static_cast<int>((qb & 0x0f) | (((qh >> 2) & 3) << 4)) - 32;
        const int q2 = static_cast<int>((qa >> 4) | (((qh >> 4) & 3) << 4)) - 32;
        const int q3 = static_cast<int>((qb >> 4) | (((qh >> 6) & 3) << 4)) - 32;
        const int j = 4 * w + n;
        out[j] = mul_rn(ds[0], static_cast<float>(q0));
        out[8 + j] = mul_rn(ds[1], static_cast<float>(q1));
        out[16 + j] = mul_rn(ds[2], static_cast<float>(q2));
        out[24 + j] = mul_rn(ds[3], static_cast<float>(q3));
      }
    }
  }
};

// Q2_K: 8 parts. Half h of 128 elements uses 32 bytes of qs; byte m holds elements 32s + m
// (s = 0..3) of the half in bits 2s..2s+1. Part p takes bytes m0..m0+7 (m0 = 8(p%4)) of half
// p/4; element 32s + m of the half is in sub-block 8h + 2s + m / 16, whose scale byte is
// scale (low nibble) and min (high nibble).
struct q2_k_block {
  static constexpr dtype type = dtype::q2_k;
  static constexpr int size = 256, bytes = 84, align = 4, parts = 8, runs = 4;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[32]) {
    const int half = part / 4, chunk = part % 4;
    uint32_t tail[1];
    load_words<1, field_align(align, 80)>(block + 80, tail);
    const float d = half_bits_to_float(tail[0] & 0xffffu), dmin = half_bits_to_float(tail[0] >> 16);
    uint32_t scales[2], q[2];
    load_words<2, field_align(align, 0, 8)>(block + 8 * half, scales);  // sub-blocks 8h .. 8h + 7
    load_words<2, field_align(align, 16, 8)>(block + 16 + 32 * half + 8 * chunk, q);
TROUPE_UNROLL
    for (int s = 0; s < 4; ++s) {
      const int index = 2 * s + chunk / 2;
      const uint32_t sc = (scales[index / 4] >> (8 * (index % 4))) & 0xffu;
      const float dl = mul_rn(d, static_cast<float>(static_cast<int>(sc & 0x0f)));
      const float ml = mul_rn(dmin, static_cast<float>(static_cast<int>(sc >> 4)));
TROUPE_UNROLL
      for (int j = 0; j < 8; ++j) {
        const uint32_t value = (q[j / 4] >> (8 * (j % 4) + 2 * s)) & 3u;
        out[8 * s + j] = sub_rn(mul_rn(dl, static_cast<float>(static_cast<int>(value))), ml);
      }
    }
  }
};

// Q3_K: 8 parts, Q2_K's arrangement of the low 2 bits (32 bytes of qs per half); the high bit of
// element 32s + l of half h is bit 4h + s of hmask[l], and a clear bit subtracts 4. Sub-block
// 8h + 2s + l / 16 has a 6-bit scale minus 32.
struct q3_k_block {
  static constexpr dtype type = dtype::q3_k;
  static constexpr int size = 256, bytes = 110, align = 2, parts = 8, runs = 4;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[32]) {
    const int half = part / 4, chunk = part % 4;
    const float d = half_bits_to_float(load_u16<2>(block + 108));
    uint32_t packed[3], mask[2], q[2];
    load_words<3, field_align(align, 96)>(block + 96, packed);
    load_words<2, field_align(align, 0, 8)>(block + 8 * chunk, mask);
    load_words<2, field_align(align, 32, 8)>(block + 32 + 32 * half + 8 * chunk, q);
TROUPE_UNROLL
    for (int s = 0; s < 4; ++s) {
      const float dl = mul_rn(d, q3_k_scale(packed, 8 * half + 2 * s + chunk / 2));
TROUPE_UNROLL
      for (int j = 0; j < 8; ++j) {
        const int low = static_cast<int>((q[j / 4] >> (8 * (j % 4) + 2 * s)) & 3u);
        const int high = static_cast<int>((mask[j / 4] >> (8 * (j % 4) + 4 * half + s)) & 1u);
        out[8 * s + j] = mul_rn(dl, static_cast<float>(low - (high ? 0 : 4)));
      }
    }
  }
};

// IQ4_XS: 16 parts. Sub-block s (32 elements) reads like an IQ4_NL block from qs[16s..16s+15]
// with a 6-bit scale (minus 32): low 4 bits in nibble s%2 of scales_l[s/2], top 2 bits at bits
// 2s of scales_h. Part p is half p%2 of sub-block p/2.
struct iq4_xs_block {
  static constexpr dtype type = dtype::iq4_xs;
  static constexpr int size = 256, bytes = 136, align = 8, parts = 16, runs = 2;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 32 * (part / 2) + 8 * (part % 2) + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&out)[16]) {
    const int sub = part / 2;
    uint32_t head[2];  // d, scales_h, scales_l[4]
    load_words<2, align>(block, head);
    const float d = half_bits_to_float(head[0] & 0xffffu);
    const uint32_t scales_h = head[0] >> 16;
    const uint32_t low = (head[1] >> (8 * (sub / 2) + 4 * (sub % 2))) & 0x0fu;
    const uint32_t high = (scales_h >> (2 * sub)) & 3u;
    const float dl = mul_rn(d, static_cast<float>(static_cast<int>(low | (high << 4)) - 32));
    uint32_t q[2];
    load_words<2, field_align(align, 8, 8)>(block + 8 + 16 * sub + 8 * (part % 2), q);
    table_nibbles<iq4_levels, false>(q, dl, out);
  }
};

// Calls fn(Block{}) with the decoder of `type`; false for a type without one.
template <class Fn>
bool visit(dtype type, Fn&& fn) {
  switch (type) {
    case dtype::q4_0: fn(q4_0_block{}); return true;
    case dtype::q4_1: fn(q4_1_block{}); return true;
    case dtype::q5_0: fn(q5_0_block{}); return true;
    case dtype::q5_1: fn(q5_1_block{}); return true;
    case dtype::q8_0: fn(q8_0_block{}); return true;
    case dtype::q2_k: fn(q2_k_block{}); return true;
    case dtype::q3_k: fn(q3_k_block{}); return true;
    case dtype::q4_k: fn(q4_k_block{}); return true;
    case dtype::q5_k: fn(q5_k_block{}); return true;
    case dtype::q6_k: fn(q6_k_block{}); return true;
    case dtype::iq4_nl: fn(iq4_nl_block{}); return true;
    case dtype::iq4_xs: fn(iq4_xs_block{}); return true;
    case dtype::mxfp4: fn(mxfp4_block{}); return true;
    default: return false;
  }
}

}  // namespace troupe::cuda::quant_blocks
