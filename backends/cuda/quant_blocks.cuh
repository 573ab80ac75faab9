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
// one 16-byte load (two for f32), whatever the type's interleaving of low and high bits. A run
// lies in one sub-block, so it has one scale (and min).
//
// decode_values computes every value with the float operations of the reference dequantizer, in
// its order, rounded the same way (no fused multiply-add): the kernels see exactly the weights
// the CPU sees.
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

// The device branches (#if TROUPE_DEVICE_BRANCH) are what nvcc compiles for the GPU. Host tests
// compile them on this machine too (TROUPE_EMULATE_DEVICE, with
// tests/backends/cuda/device_intrinsics.hpp standing in for the few device-only intrinsics),
// inside an inline namespace of their own so those copies never meet the host branches' at link
// time: the bit tricks and wide loads then run here, not only on a lent GPU.
#if defined(__CUDA_ARCH__) || defined(TROUPE_EMULATE_DEVICE)
#define TROUPE_DEVICE_BRANCH 1
#else
#define TROUPE_DEVICE_BRANCH 0
#endif
#if defined(TROUPE_EMULATE_DEVICE)
#define TROUPE_BRANCHES_BEGIN inline namespace emulated_device {
#define TROUPE_BRANCHES_END }
#else
#define TROUPE_BRANCHES_BEGIN
#define TROUPE_BRANCHES_END
#endif

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__ __forceinline__
#define TROUPE_HOST_DEVICE_CONSTEXPR __host__ __device__ constexpr
#else
#define TROUPE_HOST_DEVICE inline
#define TROUPE_HOST_DEVICE_CONSTEXPR constexpr
#endif
// Only nvcc's device pass knows `#pragma unroll`; its host pass hands the code to g++, which
// would warn about an unknown pragma (and -Werror stops the build).
#if defined(__CUDA_ARCH__)
#define TROUPE_UNROLL _Pragma("unroll")
#else
#define TROUPE_UNROLL
#endif

namespace troupe::cuda::quant_blocks {
TROUPE_BRANCHES_BEGIN

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
#if TROUPE_DEVICE_BRANCH
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
    for (int i = 0; i < N; ++i)
      words[i] = static_cast<uint32_t>(h[2 * i]) | (static_cast<uint32_t>(h[2 * i + 1]) << 16);
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
#if TROUPE_DEVICE_BRANCH
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

TROUPE_HOST_DEVICE uint32_t load_u8(const std::byte* p) {
  return static_cast<uint32_t>(*reinterpret_cast<const uint8_t*>(p));
}

TROUPE_HOST_DEVICE float bits_as_float(uint32_t bits) {
#if TROUPE_DEVICE_BRANCH
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

// The IEEE half with bits `bits` as a float (exact).
TROUPE_HOST_DEVICE float half_bits_to_float(uint32_t bits) {
#if TROUPE_DEVICE_BRANCH
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#else
  return f16_to_f32(static_cast<uint16_t>(bits));
#endif
}

// Products and sums rounded on their own, never fused, as the reference computes them.
TROUPE_HOST_DEVICE float mul_rn(float a, float b) {
#if TROUPE_DEVICE_BRANCH
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TROUPE_HOST_DEVICE float add_rn(float a, float b) {
#if TROUPE_DEVICE_BRANCH
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TROUPE_HOST_DEVICE float sub_rn(float a, float b) {
#if TROUPE_DEVICE_BRANCH
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Byte `n` of x:y (bytes 0-3 of x, then 4-7 of y) for each selector nibble of `s` (3 bits used).
TROUPE_HOST_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if TROUPE_DEVICE_BRANCH
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
#if TROUPE_DEVICE_BRANCH
  return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7540u | N)) - (8388608.0f + static_cast<float>(Offset));
#else
  return static_cast<float>(static_cast<int>((v >> (8 * N)) & 0xffu) - Offset);
#endif
}

constexpr uint32_t pack_levels(int a, int b, int c, int d) {
  return static_cast<uint32_t>(static_cast<uint8_t>(a)) | (static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8) |
         (static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24);
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
TROUPE_HOST_DEVICE float e8m0_half(uint32_t e) { return bits_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23)); }

// Word i of `words` for an i known only at run time, through selects: indexing a register array
// with a run-time value would put the array in (slow) local memory.
template <int N>
TROUPE_HOST_DEVICE uint32_t pick(const uint32_t (&words)[N], int i) {
  uint32_t word = words[0];
  TROUPE_UNROLL
  for (int k = 1; k < N; ++k) word = i == k ? words[k] : word;
  return word;
}

// Byte i (run time) of the little-endian bytes held in `words`.
template <int N>
TROUPE_HOST_DEVICE uint32_t pick_byte(const uint32_t (&words)[N], int i) {
  return (pick(words, i / 4) >> (8 * (i % 4))) & 0xffu;
}

// out[0..3] = the bytes of `word`, each minus Offset, as floats (byte_value).
template <int Offset>
TROUPE_HOST_DEVICE void bytes_to_floats(uint32_t word, float* out) {
  out[0] = byte_value<Offset, 0>(word);
  out[1] = byte_value<Offset, 1>(word);
  out[2] = byte_value<Offset, 2>(word);
  out[3] = byte_value<Offset, 3>(word);
}

// Bits 0..3 of b moved to bit 4 of bytes 0..3: a 5th bit for each of four nibble bytes.
TROUPE_HOST_DEVICE uint32_t bits_to_bit4_of_bytes(uint32_t b) {
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes held in
// `packed` (3 words) (block_fields.hpp: k_scale_min). Branch-free, as threads of one warp ask
// for different sub-blocks: words 0 and 1 hold sub-blocks 0-3's scales and mins in their low 6
// bits per byte and the top 2 bits of 4-7's; word 2 the low 4 bits of 4-7's, scale and min nibbles.
TROUPE_HOST_DEVICE void k_scale_min(const uint32_t (&packed)[3], int j, float* scale, float* min) {
  const int shift = 8 * (j & 3);
  const uint32_t a = packed[0] >> shift, b = packed[1] >> shift, c = packed[2] >> shift;
  const uint32_t sc = j < 4 ? (a & 63) : ((c & 0x0f) | ((a >> 2) & 0x30));
  const uint32_t m = j < 4 ? (b & 63) : (((c >> 4) & 0x0f) | ((b >> 2) & 0x30));
  *scale = static_cast<float>(static_cast<int>(sc));
  *min = static_cast<float>(static_cast<int>(m));
}

// Q3_K: the 6-bit scale (minus 32) of sub-block j (0..15) (block_fields.hpp: q3_k_scales): low
// 4 bits in the nibble j / 8 of byte j % 8, top 2 bits at bits 2 (j / 4) of byte 8 + j % 4.
TROUPE_HOST_DEVICE float q3_k_scale(const uint32_t (&packed)[3], int j) {
  const uint32_t low = (pick_byte(packed, j & 7) >> (4 * (j >> 3))) & 0x0f;
  const uint32_t high = (((packed[2] >> (8 * (j & 3))) & 0xffu) >> (2 * (j >> 2))) & 3;
  return static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
}

// ---- decoders ----
//
// decode(block, part, codes, scale, min) gives a part's codes (small integers, or table levels)
// and, per run, the scale (and for types with a min, the min) that make them values:
//   value = scale[run] * code            (has_min false)
//   value = scale[run] * code - min[run] (has_min true)
// each product and difference rounded on its own: exactly the reference dequantizer's value
// (decode_values). The GEMV keeps them apart: scale * sum(code * x) - min * sum(x) is one
// multiply-add per weight instead of three.

// Codes of the 16 nibbles of q[0..1] (8 bytes), minus Offset: codes[0..7] from the low nibbles,
// codes[8..15] from the high ones.
template <int Offset>
TROUPE_HOST_DEVICE void nibble_codes(const uint32_t (&q)[2], float (&codes)[16]) {
  TROUPE_UNROLL
  for (int w = 0; w < 2; ++w) {
    bytes_to_floats<Offset>(q[w] & 0x0f0f0f0fu, codes + 4 * w);
    bytes_to_floats<Offset>((q[w] >> 4) & 0x0f0f0f0fu, codes + 8 + 4 * w);
  }
}

// The table levels (int8) that the 16 nibbles of q[0..1] select, ordered as nibble_codes.
template <class Table>
TROUPE_HOST_DEVICE void level_codes(const uint32_t (&q)[2], float (&codes)[16]) {
  TROUPE_UNROLL
  for (int w = 0; w < 2; ++w) {
    bytes_to_floats<128>(lookup4<Table>(q[w] & 0x0f0f0f0fu) ^ 0x80808080u, codes + 4 * w);
    bytes_to_floats<128>(lookup4<Table>((q[w] >> 4) & 0x0f0f0f0fu) ^ 0x80808080u, codes + 8 + 4 * w);
  }
}

template <int Runs>
TROUPE_HOST_DEVICE void fill(float (&to)[Runs], float value) {
  TROUPE_UNROLL
  for (int r = 0; r < Runs; ++r) to[r] = value;
}

// The legacy types: blocks of 32 in two parts. Part p holds bytes 8p..8p+7 of the 16 quant
// bytes: elements 8p..8p+7 (low nibbles) and 16+8p..16+8p+7 (high nibbles). Q8_0's part p is
// elements 16p..16p+15.

struct q4_0_block {
  static constexpr dtype type = dtype::q4_0;
  static constexpr int size = 32, bytes = 18, align = 2, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, half_bits_to_float(load_u16<align>(block)));
    uint32_t q[2];
    load_words<2, field_align(align, 2, 8)>(block + 2 + 8 * part, q);
    nibble_codes<8>(q, codes);
  }
};

// value = d * q + m, i.e. d * q - (-m).
struct q4_1_block {
  static constexpr dtype type = dtype::q4_1;
  static constexpr int size = 32, bytes = 20, align = 4, parts = 2, runs = 2;
  static constexpr bool has_min = true;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&min)[2]) {
    uint32_t head[1];
    load_words<1, align>(block, head);
    fill(scale, half_bits_to_float(head[0] & 0xffffu));
    fill(min, -half_bits_to_float(head[0] >> 16));
    uint32_t q[2];
    load_words<2, field_align(align, 4, 8)>(block + 4 + 8 * part, q);
    nibble_codes<0>(q, codes);
  }
};

// Q5_0 / Q5_1: bit j of the 32-bit qh is the 5th bit of element j. The nibble bytes get their
// 5th bit at bit 4, then become codes (0..31, minus Offset) four at a time.
template <int Offset>
TROUPE_HOST_DEVICE void five_bit_codes(const uint32_t (&q)[2], uint32_t qh, int part, float (&codes)[16]) {
  TROUPE_UNROLL
  for (int w = 0; w < 2; ++w) {
    const uint32_t low = (q[w] & 0x0f0f0f0fu) | bits_to_bit4_of_bytes(qh >> (8 * part + 4 * w));
    const uint32_t high = ((q[w] >> 4) & 0x0f0f0f0fu) | bits_to_bit4_of_bytes(qh >> (16 + 8 * part + 4 * w));
    bytes_to_floats<Offset>(low, codes + 4 * w);
    bytes_to_floats<Offset>(high, codes + 8 + 4 * w);
  }
}

struct q5_0_block {
  static constexpr dtype type = dtype::q5_0;
  static constexpr int size = 32, bytes = 22, align = 2, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, half_bits_to_float(load_u16<align>(block)));
    uint32_t qh[1], q[2];
    load_words<1, field_align(align, 2)>(block + 2, qh);
    load_words<2, field_align(align, 6, 8)>(block + 6 + 8 * part, q);
    five_bit_codes<16>(q, qh[0], part, codes);
  }
};

struct q5_1_block {
  static constexpr dtype type = dtype::q5_1;
  static constexpr int size = 32, bytes = 24, align = 8, parts = 2, runs = 2;
  static constexpr bool has_min = true;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&min)[2]) {
    uint32_t head[2];  // d, m, qh
    load_words<2, align>(block, head);
    fill(scale, half_bits_to_float(head[0] & 0xffffu));
    fill(min, -half_bits_to_float(head[0] >> 16));
    uint32_t q[2];
    load_words<2, field_align(align, 8, 8)>(block + 8 + 8 * part, q);
    five_bit_codes<0>(q, head[1], part, codes);
  }
};

struct q8_0_block {
  static constexpr dtype type = dtype::q8_0;
  static constexpr int size = 32, bytes = 34, align = 2, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 16 * part + 8 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, half_bits_to_float(load_u16<align>(block)));
    uint32_t q[4];
    load_words<4, field_align(align, 2, 16)>(block + 2 + 16 * part, q);
    TROUPE_UNROLL
    for (int w = 0; w < 4; ++w) bytes_to_floats<128>(q[w] ^ 0x80808080u, codes + 4 * w);  // int8 b = (b ^ 0x80) - 128
  }
};

struct iq4_nl_block {
  static constexpr dtype type = dtype::iq4_nl;
  static constexpr int size = 32, bytes = 18, align = 2, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, half_bits_to_float(load_u16<align>(block)));
    uint32_t q[2];
    load_words<2, field_align(align, 2, 8)>(block + 2 + 8 * part, q);
    level_codes<iq4_levels>(q, codes);
  }
};

// The reference multiplies level * scale; the product is the same either way round.
struct mxfp4_block {
  static constexpr dtype type = dtype::mxfp4;
  static constexpr int size = 32, bytes = 17, align = 1, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 8 * part + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, e8m0_half(load_u8(block)));
    uint32_t q[2];
    load_words<2, 1>(block + 1 + 8 * part, q);
    level_codes<mxfp4_levels>(q, codes);
  }
};

// ---- the k-quants: super-blocks of 256 ----

// Q4_K: 16 parts. The quants come in 4 groups of 32 bytes, group g holding elements 64g..64g+31
// in its low nibbles (sub-block 2g) and 64g+32..64g+63 in its high nibbles (sub-block 2g + 1).
// Part p takes bytes 8(p%4)..+7 of group p/4. value = d * scale * q - dmin * min.
struct q4_k_block {
  static constexpr dtype type = dtype::q4_k;
  static constexpr int size = 256, bytes = 144, align = 16, parts = 16, runs = 2;
  static constexpr bool has_min = true;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 64 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&min)[2]) {
    const int group = part / 4;
    uint32_t head[4];  // d, dmin, and the 12 bytes of packed scales
    load_words<4, align>(block, head);
    k_quant_scales(head, group, scale, min);
    uint32_t q[2];
    load_words<2, field_align(align, 16, 8)>(block + 16 + 32 * group + 8 * (part % 4), q);
    nibble_codes<0>(q, codes);
  }

  // Sub-blocks 2g and 2g + 1: scale d * sc, min dmin * m (head: d, dmin, packed scales).
  TROUPE_HOST_DEVICE static void k_quant_scales(const uint32_t (&head)[4], int group, float (&scale)[2],
                                                float (&min)[2]) {
    const float d = half_bits_to_float(head[0] & 0xffffu), dmin = half_bits_to_float(head[0] >> 16);
    const uint32_t packed[3] = {head[1], head[2], head[3]};
    TROUPE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float sc, m;
      k_scale_min(packed, 2 * group + r, &sc, &m);
      scale[r] = mul_rn(d, sc);
      min[r] = mul_rn(dmin, m);
    }
  }
};

// Q5_K: Q4_K's layout plus a 5th bit: element 64g + l (l < 32) takes bit 2g of qh[l], element
// 64g + 32 + l bit 2g + 1.
struct q5_k_block {
  static constexpr dtype type = dtype::q5_k;
  static constexpr int size = 256, bytes = 176, align = 16, parts = 16, runs = 2;
  static constexpr bool has_min = true;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 64 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&min)[2]) {
    const int group = part / 4, chunk = part % 4;
    uint32_t head[4];
    load_words<4, align>(block, head);
    q4_k_block::k_quant_scales(head, group, scale, min);
    uint32_t qh[2], q[2];
    load_words<2, field_align(align, 16, 8)>(block + 16 + 8 * chunk, qh);
    load_words<2, field_align(align, 48, 8)>(block + 48 + 32 * group + 8 * chunk, q);
    TROUPE_UNROLL
    for (int w = 0; w < 2; ++w) {
      // Bit 2g of each qh byte is the 5th bit of the low nibble's element, bit 2g + 1 the high's.
      const uint32_t low = (q[w] & 0x0f0f0f0fu) | (((qh[w] >> (2 * group)) & 0x01010101u) << 4);
      const uint32_t high = ((q[w] >> 4) & 0x0f0f0f0fu) | (((qh[w] >> (2 * group + 1)) & 0x01010101u) << 4);
      bytes_to_floats<0>(low, codes + 4 * w);
      bytes_to_floats<0>(high, codes + 8 + 4 * w);
    }
  }
};

// Q6_K: 8 parts. Each half h of 128 elements uses 64 bytes of ql, 32 of qh and 8 scales; part p
// takes bytes l0..l0+7 (l0 = 8(p%4)) of ql, of ql + 32 and of qh in half p/4, which hold elements
// l0 + j + 32k (k = 0..3) of the half: ql low / ql+32 low / ql high / ql+32 high nibbles, with
// bits 2k..2k+1 of qh on top; element e of the half has scale sc[8h + e / 16]. value =
// (d * sc) * (q - 32).
struct q6_k_block {
  static constexpr dtype type = dtype::q6_k;
  static constexpr int size = 256, bytes = 210, align = 2, parts = 8, runs = 4;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[32], float (&scale)[4],
                                        float (&)[4]) {
    const int half = part / 4, chunk = part % 4;
    const float d = half_bits_to_float(load_u16<2>(block + 208));
    uint32_t a[2], b[2], h[2], scales[2];
    load_words<2, field_align(align, 0, 8)>(block + 64 * half + 8 * chunk, a);
    load_words<2, field_align(align, 32, 8)>(block + 64 * half + 32 + 8 * chunk, b);
    load_words<2, field_align(align, 128, 8)>(block + 128 + 32 * half + 8 * chunk, h);
    load_words<2, field_align(align, 192, 8)>(block + 192 + 8 * half, scales);
    // Elements l0 + j + 32k have scale index (l0 + 32k) / 16 = chunk / 2 + 2k within the half.
    TROUPE_UNROLL
    for (int k = 0; k < 4; ++k) {
      scale[k] = mul_rn(d, static_cast<float>(static_cast<int8_t>(pick_byte(scales, chunk / 2 + 2 * k))));
    }
    TROUPE_UNROLL
    for (int w = 0; w < 2; ++w) {
      // The four 6-bit codes of each byte position, built four bytes at a time: a nibble of ql (or
      // ql + 32) below bits 2k..2k+1 of qh moved to bits 4-5.
      bytes_to_floats<32>((a[w] & 0x0f0f0f0fu) | ((h[w] << 4) & 0x30303030u), codes + 4 * w);
      bytes_to_floats<32>((b[w] & 0x0f0f0f0fu) | ((h[w] << 2) & 0x30303030u), codes + 8 + 4 * w);
      bytes_to_floats<32>(((a[w] >> 4) & 0x0f0f0f0fu) | (h[w] & 0x30303030u), codes + 16 + 4 * w);
      bytes_to_floats<32>(((b[w] >> 4) & 0x0f0f0f0fu) | ((h[w] >> 2) & 0x30303030u), codes + 24 + 4 * w);
    }
  }
};

// Q2_K: 8 parts. Half h of 128 elements uses 32 bytes of qs; byte m holds elements 32s + m
// (s = 0..3) of the half in bits 2s..2s+1. Part p takes bytes m0..m0+7 (m0 = 8(p%4)) of half
// p/4; element 32s + m of the half is in sub-block 8h + 2s + m / 16, whose scale byte is
// scale (low nibble) and min (high nibble). value = (d * scale) * q - dmin * min.
struct q2_k_block {
  static constexpr dtype type = dtype::q2_k;
  static constexpr int size = 256, bytes = 84, align = 4, parts = 8, runs = 4;
  static constexpr bool has_min = true;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[32], float (&scale)[4],
                                        float (&min)[4]) {
    const int half = part / 4, chunk = part % 4;
    uint32_t tail[1];
    load_words<1, field_align(align, 80)>(block + 80, tail);
    const float d = half_bits_to_float(tail[0] & 0xffffu), dmin = half_bits_to_float(tail[0] >> 16);
    uint32_t scales[2], q[2];
    load_words<2, field_align(align, 0, 8)>(block + 8 * half, scales);  // sub-blocks 8h .. 8h + 7
    load_words<2, field_align(align, 16, 8)>(block + 16 + 32 * half + 8 * chunk, q);
    TROUPE_UNROLL
    for (int s = 0; s < 4; ++s) {
      const uint32_t sc = pick_byte(scales, 2 * s + chunk / 2);
      scale[s] = mul_rn(d, static_cast<float>(static_cast<int>(sc & 0x0f)));
      min[s] = mul_rn(dmin, static_cast<float>(static_cast<int>(sc >> 4)));
      TROUPE_UNROLL
      for (int w = 0; w < 2; ++w) bytes_to_floats<0>((q[w] >> (2 * s)) & 0x03030303u, codes + 8 * s + 4 * w);
    }
  }
};

// Q3_K: 8 parts, Q2_K's arrangement of the low 2 bits (32 bytes of qs per half); the high bit of
// element 32s + l of half h is bit 4h + s of hmask[l], and a clear bit subtracts 4. Sub-block
// 8h + 2s + l / 16 has a 6-bit scale minus 32. value = (d * scale) * q.
struct q3_k_block {
  static constexpr dtype type = dtype::q3_k;
  static constexpr int size = 256, bytes = 110, align = 2, parts = 8, runs = 4;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 128 * (part / 4) + 8 * (part % 4) + 32 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[32], float (&scale)[4],
                                        float (&)[4]) {
    const int half = part / 4, chunk = part % 4;
    const float d = half_bits_to_float(load_u16<2>(block + 108));
    uint32_t packed[3], mask[2], q[2];
    load_words<3, field_align(align, 96)>(block + 96, packed);
    load_words<2, field_align(align, 0, 8)>(block + 8 * chunk, mask);
    load_words<2, field_align(align, 32, 8)>(block + 32 + 32 * half + 8 * chunk, q);
    TROUPE_UNROLL
    for (int s = 0; s < 4; ++s) {
      scale[s] = mul_rn(d, q3_k_scale(packed, 8 * half + 2 * s + chunk / 2));
      TROUPE_UNROLL
      for (int w = 0; w < 2; ++w) {
        // low | high << 2 is the code plus 4 (a clear high bit subtracts 4): 0..7, minus 4.
        const uint32_t low = (q[w] >> (2 * s)) & 0x03030303u;
        const uint32_t high = (mask[w] >> (4 * half + s)) & 0x01010101u;
        bytes_to_floats<4>(low | (high << 2), codes + 8 * s + 4 * w);
      }
    }
  }
};

// IQ4_XS: 16 parts. Sub-block s (32 elements) reads like an IQ4_NL block from qs[16s..16s+15]
// with a 6-bit scale (minus 32): low 4 bits in nibble s%2 of scales_l[s/2], top 2 bits at bits
// 2s of scales_h. Part p is half p%2 of sub-block p/2. value = (d * scale) * level.
struct iq4_xs_block {
  static constexpr dtype type = dtype::iq4_xs;
  static constexpr int size = 256, bytes = 136, align = 8, parts = 16, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 32 * (part / 2) + 8 * (part % 2) + 16 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    const int sub = part / 2;
    uint32_t head[2];  // d, scales_h, scales_l[4]
    load_words<2, align>(block, head);
    const float d = half_bits_to_float(head[0] & 0xffffu);
    const uint32_t low = (head[1] >> (4 * sub)) & 0x0fu;  // nibble s % 2 of byte s / 2
    const uint32_t high = (head[0] >> (16 + 2 * sub)) & 3u;
    fill(scale, mul_rn(d, static_cast<float>(static_cast<int>(low | (high << 4)) - 32)));
    uint32_t q[2];
    load_words<2, field_align(align, 8, 8)>(block + 8 + 16 * sub + 8 * (part % 2), q);
    level_codes<iq4_levels>(q, codes);
  }
};

// ---- FP8 E4M3FN (model/quant/fp8.hpp) ----

// The E4M3FN values of the four bytes of `word`, exactly (fp8_e4m3_to_f32): sign and the 7
// magnitude bits placed at the top of an f32, whose exponent bias (127) is then brought to
// E4M3's (7) by a multiplication by 2^120, exact for normal and subnormal codes alike (no
// flush-to-zero: the build does not use fast math); the NaN codes (S.1111.111) give NaN, as the
// reference does.
TROUPE_HOST_DEVICE void fp8_to_floats(uint32_t word, float* out) {
  TROUPE_UNROLL
  for (int n = 0; n < 4; ++n) {
    const uint32_t b = (word >> (8 * n)) & 0xffu;
    const uint32_t sign = (b & 0x80u) << 24;
    out[n] = (b & 0x7fu) == 0x7fu ? bits_as_float(sign | 0x7fc00000u)
                                  : mul_rn(bits_as_float(sign | ((b & 0x7fu) << 20)), 0x1p120f);
  }
}

// fp8_e4m3: one byte per element, no scale in the bytes (a checkpoint's row scales are the
// weight's, applied per row: linear_weight::row_scales). Decoded in blocks of 32 bytes, rows
// of whole blocks; two parts of 16.
struct fp8_e4m3_block {
  static constexpr dtype type = dtype::fp8_e4m3;
  static constexpr int size = 32, bytes = 32, align = 16, parts = 2, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 16 * part + 8 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    fill(scale, 1.0f);
    uint32_t q[4];
    load_words<4, align>(block + 16 * part, q);
    TROUPE_UNROLL
    for (int w = 0; w < 4; ++w) fp8_to_floats(q[w], codes + 4 * w);
  }
};

// fp8_e4m3_b128: blocks of [f32 scale][128 E4M3], value = scale * e4m3; eight parts of 16.
struct fp8_e4m3_b128_block {
  static constexpr dtype type = dtype::fp8_e4m3_b128;
  static constexpr int size = 128, bytes = 132, align = 4, parts = 8, runs = 2;
  static constexpr bool has_min = false;
  TROUPE_HOST_DEVICE static int run_start(int part, int run) { return 16 * part + 8 * run; }
  TROUPE_HOST_DEVICE static void decode(const std::byte* block, int part, float (&codes)[16], float (&scale)[2],
                                        float (&)[2]) {
    uint32_t head[1];
    load_words<1, align>(block, head);
    fill(scale, bits_as_float(head[0]));
    uint32_t q[4];
    load_words<4, field_align(align, 4, 16)>(block + 4 + 16 * part, q);
    TROUPE_UNROLL
    for (int w = 0; w < 4; ++w) fp8_to_floats(q[w], codes + 4 * w);
  }
};

// A part's values, exactly the reference dequantizer's: out[i * 8 + j] is element
// run_start(part, i) + j of the block.
template <class Block>
TROUPE_HOST_DEVICE void decode_values(const std::byte* block, int part, float (&out)[Block::runs * 8]) {
  float scale[Block::runs], min[Block::runs];
  Block::decode(block, part, out, scale, min);
  TROUPE_UNROLL
  for (int run = 0; run < Block::runs; ++run) {
    TROUPE_UNROLL
    for (int j = 0; j < 8; ++j) {
      const float product = mul_rn(scale[run], out[run * 8 + j]);
      out[run * 8 + j] = Block::has_min ? sub_rn(product, min[run]) : product;
    }
  }
}

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
    case dtype::fp8_e4m3: fn(fp8_e4m3_block{}); return true;
    case dtype::fp8_e4m3_b128: fn(fp8_e4m3_b128_block{}); return true;
    default: return false;
  }
}

// Elements per block of the decoder of `type`; 0 for a type without one. (FP8 is decoded in
// blocks of 32 although its registry block is one element: its rows must be whole 32s here.)
inline int decoder_block_size(dtype type) {
  int size = 0;
  visit(type, [&](auto decoder) { size = decltype(decoder)::size; });
  return size;
}

TROUPE_BRANCHES_END
}  // namespace troupe::cuda::quant_blocks
