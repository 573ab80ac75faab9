#pragma once
// Every quantized weight type read as integer codes and sub-block scales: element e of a row
// is D[e / sub] * code[e] + M[e / sub] (M only for types with a min), with code[e] a small
// signed integer. This is the form the integer kernels (quant_kernels_impl.hpp) multiply, and
// the form to_f32 converts from: each D, M and code is computed with the float operations of the
// reference dequantizer (model/quant), so D * code (+ M) is its value bit for bit.
//
// One struct per type, with its constants and decode<B, Bias>(): `num_blocks` whole blocks of the
// type (at most 256 elements) at `src` into codes [num_blocks * block] (each plus Bias: a kernel
// that wants unsigned bytes gets them in the same pass), D and M [num_blocks * block / sub].
// Written in the byte operations of B (quant_bytes_x86.hpp; scalar_qvec for the portable level);
// included only by the per-ISA kernel files, inside their anonymous namespace (internal linkage:
// see row_kernels_impl.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/dtype.hpp"
#include "model/quant/block_fields.hpp"

namespace troupe::cpu {
namespace {

using quant::bytes_at;
using quant::read_u32;

// The range of the codes tells a kernel which integer product is safe (see quant_kernels_impl.hpp).
template <dtype T, int64_t Block, size_t Bytes, int Sub, int MinCode, int MaxCode, bool HasMin>
struct code_traits {
  static constexpr dtype type = T;
  static constexpr int64_t block = Block;       // elements per block
  static constexpr size_t block_bytes = Bytes;  // bytes per block
  static constexpr int sub = Sub;               // elements per scale (16 or 32)
  static constexpr int min_code = MinCode;
  static constexpr int max_code = MaxCode;
  static constexpr bool has_min = HasMin;
};

template <class B>
float half_at(const std::byte* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return B::half(bits);
}

// Element j of a 32-block is the low nibble of qs[j], element j + 16 its high nibble.
template <class B>
void nibbles_of_32(const uint8_t* qs, int8_t add, int8_t* c) {
  B::nibbles32(qs, add, c);
}

struct q4_0_codes : code_traits<dtype::q4_0, 32, 18, 32, -8, 7, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      nibbles_of_32<B>(bytes_at(block + 2), static_cast<int8_t>(Bias - 8), codes + b * 32);
    }
  }
};

struct q4_1_codes : code_traits<dtype::q4_1, 32, 20, 32, 0, 15, true> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      M[b] = half_at<B>(block + 2);
      nibbles_of_32<B>(bytes_at(block + 4), static_cast<int8_t>(Bias), codes + b * 32);
    }
  }
};

// Q5_0 / Q5_1: bit j of the 32-bit qh is the 5th bit of element j.
struct q5_0_codes : code_traits<dtype::q5_0, 32, 22, 32, -16, 15, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      nibbles_of_32<B>(bytes_at(block + 6), static_cast<int8_t>(Bias - 16), codes + b * 32);
      B::add_bits32(read_u32(block + 2), 16, codes + b * 32);
    }
  }
};

struct q5_1_codes : code_traits<dtype::q5_1, 32, 24, 32, 0, 31, true> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      M[b] = half_at<B>(block + 2);
      nibbles_of_32<B>(bytes_at(block + 8), static_cast<int8_t>(Bias), codes + b * 32);
      B::add_bits32(read_u32(block + 4), 16, codes + b * 32);
    }
  }
};

struct q8_0_codes : code_traits<dtype::q8_0, 32, 34, 32, -128, 127, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      std::memcpy(codes + b * 32, block + 2, 32);
      if constexpr (Bias != 0) B::add_bytes(codes + b * 32, 32, static_cast<int8_t>(Bias));
    }
  }
};

// Q2_K: element 128 h + 32 s + l (l < 32) is bits 2s of qs[32 h + l]; its sub-block
// (e / 16 = 8 h + 2 s + l / 16) has scale d * (sc & 15) and min dmin * (sc >> 4).
struct q2_k_codes : code_traits<dtype::q2_k, 256, 84, 16, 0, 3, true> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const uint8_t* scales = bytes_at(block);
      const uint8_t* qs = bytes_at(block + 16);
      const float d = half_at<B>(block + 80);
      const float dmin = half_at<B>(block + 82);
      for (int s = 0; s < 16; ++s) {
        D[b * 16 + s] = d * static_cast<float>(scales[s] & 0x0f);
        M[b * 16 + s] = -(dmin * static_cast<float>(scales[s] >> 4));
      }
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 4; ++s)
          B::field32(qs + 32 * h, 2 * s, 3, static_cast<int8_t>(Bias), codes + b * 256 + 128 * h + 32 * s);
      }
    }
  }
};

// Q3_K: element 128 h + 32 s + l: low 2 bits at bits 2s of qs[32 h + l], minus 4 unless bit
// 4 h + s of hmask[l] is set.
struct q3_k_codes : code_traits<dtype::q3_k, 256, 110, 16, -4, 3, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const uint8_t* hmask = bytes_at(block);
      const uint8_t* qs = bytes_at(block + 32);
      int8_t scales[16];
      quant::q3_k_scales(bytes_at(block + 96), scales);
      const float d = half_at<B>(block + 108);
      for (int s = 0; s < 16; ++s) D[b * 16 + s] = d * static_cast<float>(scales[s]);
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 4; ++s) {
          int8_t* c = codes + b * 256 + 128 * h + 32 * s;
          B::field32(qs + 32 * h, 2 * s, 3, static_cast<int8_t>(Bias - 4), c);
          B::add_field32(hmask, 4 * h + s, 1, 2, c);
        }
      }
    }
  }
};

// Q4_K: each 64 elements are 32 bytes of qs, low nibbles first; sub-block i has scale d * sc_i
// and min dmin * m_i.
struct q4_k_codes : code_traits<dtype::q4_k, 256, 144, 32, 0, 15, true> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = half_at<B>(block);
      const float dmin = half_at<B>(block + 2);
      const uint8_t* packed = bytes_at(block + 4);
      const uint8_t* q = bytes_at(block + 16);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        quant::k_scale_min(s, packed, &sc, &m);
        D[b * 8 + s] = d * static_cast<float>(sc);
        M[b * 8 + s] = -(dmin * static_cast<float>(m));
      }
      for (int i = 0; i < 4; ++i) {
        B::field32(q + 32 * i, 0, 0x0f, static_cast<int8_t>(Bias), codes + b * 256 + 64 * i);
        B::field32(q + 32 * i, 4, 0x0f, static_cast<int8_t>(Bias), codes + b * 256 + 64 * i + 32);
      }
    }
  }
};

// Q5_K: Q4_K plus a 5th bit: element 64 i + l takes bit 2i of qh[l], element 64 i + 32 + l bit 2i + 1.
struct q5_k_codes : code_traits<dtype::q5_k, 256, 176, 32, 0, 31, true> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = half_at<B>(block);
      const float dmin = half_at<B>(block + 2);
      const uint8_t* packed = bytes_at(block + 4);
      const uint8_t* qh = bytes_at(block + 16);
      const uint8_t* ql = bytes_at(block + 48);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        quant::k_scale_min(s, packed, &sc, &m);
        D[b * 8 + s] = d * static_cast<float>(sc);
        M[b * 8 + s] = -(dmin * static_cast<float>(m));
      }
      for (int i = 0; i < 4; ++i) {
        int8_t* c = codes + b * 256 + 64 * i;
        B::field32(ql + 32 * i, 0, 0x0f, static_cast<int8_t>(Bias), c);
        B::add_field32(qh, 2 * i, 1, 4, c);
        B::field32(ql + 32 * i, 4, 0x0f, static_cast<int8_t>(Bias), c + 32);
        B::add_field32(qh, 2 * i + 1, 1, 4, c + 32);
      }
    }
  }
};

// Q6_K: each half of 128 elements has 64 bytes of ql and 32 of qh: for l < 32, elements l,
// l + 32, l + 64, l + 96 are ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high nibbles with
// bits 0-1, 2-3, 4-5, 6-7 of qh[l] on top, minus 32; scale d * sc[e / 16].
struct q6_k_codes : code_traits<dtype::q6_k, 256, 210, 16, -32, 31, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
      const float d = half_at<B>(block + 208);
      for (int s = 0; s < 16; ++s) D[b * 16 + s] = d * static_cast<float>(sc[s]);
      constexpr auto add = static_cast<int8_t>(Bias - 32);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = bytes_at(block + 64 * h);
        const uint8_t* qh = bytes_at(block + 128 + 32 * h);
        int8_t* c = codes + b * 256 + 128 * h;
        for (int t = 0; t < 4; ++t) {
          B::field32(ql + 32 * (t & 1), 4 * (t >> 1), 0x0f, add, c + 32 * t);
          B::add_field32(qh, 2 * t, 3, 4, c + 32 * t);
        }
      }
    }
  }
};

// The non-linear types: 4-bit indices into a table of levels (plus Bias, folded into the table).
struct level_table {
  alignas(16) int8_t levels[16];
};
template <int Bias>
level_table biased(const int8_t* levels) {
  level_table table;
  for (int i = 0; i < 16; ++i) table.levels[i] = static_cast<int8_t>(levels[i] + Bias);
  return table;
}
template <class B>
void table_codes_of_32(const uint8_t* qs, const level_table& table, int8_t* c) {
  nibbles_of_32<B>(qs, 0, c);
  B::lookup(table.levels, c, 32);
}

struct iq4_nl_codes : code_traits<dtype::iq4_nl, 32, 18, 32, -127, 113, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    const level_table table = biased<Bias>(quant::iq4_levels);
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = half_at<B>(block);
      table_codes_of_32<B>(bytes_at(block + 2), table, codes + b * 32);
    }
  }
};

struct iq4_xs_codes : code_traits<dtype::iq4_xs, 256, 136, 32, -127, 113, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    const level_table table = biased<Bias>(quant::iq4_levels);
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = half_at<B>(block);
      for (int s = 0; s < 8; ++s) {
        D[b * 8 + s] = d * static_cast<float>(quant::iq4_xs_sub_scale(block, s));
        table_codes_of_32<B>(bytes_at(block + 8 + 16 * s), table, codes + b * 256 + 32 * s);
      }
    }
  }
};

struct mxfp4_codes : code_traits<dtype::mxfp4, 32, 17, 32, -12, 12, false> {
  template <class B, int Bias>
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    const level_table table = biased<Bias>(quant::mxfp4_doubled_levels);
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = quant::e8m0_half(bytes_at(block)[0]);
      table_codes_of_32<B>(bytes_at(block + 1), table, codes + b * 32);
    }
  }
};

// Calls fn(codes_type{}) for the codes struct of `type`; false when `type` has none.
template <class Fn>
bool with_codes(dtype type, Fn&& fn) {
  switch (type) {
    case dtype::q4_0: fn(q4_0_codes{}); return true;
    case dtype::q4_1: fn(q4_1_codes{}); return true;
    case dtype::q5_0: fn(q5_0_codes{}); return true;
    case dtype::q5_1: fn(q5_1_codes{}); return true;
    case dtype::q8_0: fn(q8_0_codes{}); return true;
    case dtype::q2_k: fn(q2_k_codes{}); return true;
    case dtype::q3_k: fn(q3_k_codes{}); return true;
    case dtype::q4_k: fn(q4_k_codes{}); return true;
    case dtype::q5_k: fn(q5_k_codes{}); return true;
    case dtype::q6_k: fn(q6_k_codes{}); return true;
    case dtype::iq4_nl: fn(iq4_nl_codes{}); return true;
    case dtype::iq4_xs: fn(iq4_xs_codes{}); return true;
    case dtype::mxfp4: fn(mxfp4_codes{}); return true;
    default: return false;
  }
}

}  // namespace
}  // namespace troupe::cpu
