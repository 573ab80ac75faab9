#pragma once
// Every quantized weight type read as integer codes and sub-block scales: element e of a row
// is D[e / sub] * code[e] + M[e / sub] (M only for types with a min), with code[e] a small
// signed integer. This is the form the integer kernels (quant_kernels_impl.hpp) multiply, and
// the form to_f32 converts from: each D, M and code is computed with the float operations of the
// reference dequantizer (model/quant), so D * code (+ M) is its value bit for bit.
//
// One struct per type, with its constants and decode(): `num_blocks` whole blocks of the type
// (at most 256 elements) at `src` into codes [num_blocks * block], D and M [num_blocks * block /
// sub]. Plain loops the compiler vectorizes per ISA; included only by the per-ISA kernel files,
// inside their anonymous namespace (internal linkage: see row_kernels_impl.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/dtype.hpp"
#include "model/quant/block_fields.hpp"

namespace troupe::cpu {
namespace {

using quant::bytes_at;
using quant::read_f16;
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

struct q4_0_codes : code_traits<dtype::q4_0, 32, 18, 32, -8, 7, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      const uint8_t* qs = bytes_at(block + 2);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = static_cast<int8_t>((qs[j] & 0x0f) - 8);
        c[j + 16] = static_cast<int8_t>((qs[j] >> 4) - 8);
      }
    }
  }
};

struct q4_1_codes : code_traits<dtype::q4_1, 32, 20, 32, 0, 15, true> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      M[b] = read_f16(block + 2);
      const uint8_t* qs = bytes_at(block + 4);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = static_cast<int8_t>(qs[j] & 0x0f);
        c[j + 16] = static_cast<int8_t>(qs[j] >> 4);
      }
    }
  }
};

struct q5_0_codes : code_traits<dtype::q5_0, 32, 22, 32, -16, 15, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      const uint32_t qh = read_u32(block + 2);
      const uint8_t* qs = bytes_at(block + 6);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = static_cast<int8_t>(((qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16);
        c[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
      }
    }
  }
};

struct q5_1_codes : code_traits<dtype::q5_1, 32, 24, 32, 0, 31, true> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      M[b] = read_f16(block + 2);
      const uint32_t qh = read_u32(block + 4);
      const uint8_t* qs = bytes_at(block + 8);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = static_cast<int8_t>((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
        c[j + 16] = static_cast<int8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
    }
  }
};

struct q8_0_codes : code_traits<dtype::q8_0, 32, 34, 32, -128, 127, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      std::memcpy(codes + b * 32, block + 2, 32);
    }
  }
};

// Q2_K: element 128 h + 32 s + 16 p + l is bits 2s of qs[32 h + 16 p + l]; its sub-block
// (e / 16 = 8 h + 2 s + p) has scale d * (sc & 15) and min dmin * (sc >> 4).
struct q2_k_codes : code_traits<dtype::q2_k, 256, 84, 16, 0, 3, true> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const uint8_t* scales = bytes_at(block);
      const uint8_t* qs = bytes_at(block + 16);
      const float d = read_f16(block + 80);
      const float dmin = read_f16(block + 82);
      for (int s = 0; s < 16; ++s) {
        D[b * 16 + s] = d * static_cast<float>(scales[s] & 0x0f);
        M[b * 16 + s] = -(dmin * static_cast<float>(scales[s] >> 4));
      }
      int8_t* c = codes + b * 256;
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 4; ++s) {
          for (int l = 0; l < 32; ++l) c[128 * h + 32 * s + l] = static_cast<int8_t>((qs[32 * h + l] >> (2 * s)) & 3);
        }
      }
    }
  }
};

// Q3_K: element 128 h + 32 s + l: low 2 bits at bits 2s of qs[32 h + l], minus 4 unless bit
// 4 h + s of hmask[l] is set.
struct q3_k_codes : code_traits<dtype::q3_k, 256, 110, 16, -4, 3, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const uint8_t* hmask = bytes_at(block);
      const uint8_t* qs = bytes_at(block + 32);
      int8_t scales[16];
      quant::q3_k_scales(bytes_at(block + 96), scales);
      const float d = read_f16(block + 108);
      for (int s = 0; s < 16; ++s) D[b * 16 + s] = d * static_cast<float>(scales[s]);
      int8_t* c = codes + b * 256;
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 4; ++s) {
          const int bit = 4 * h + s;
          for (int l = 0; l < 32; ++l) {
            c[128 * h + 32 * s + l] = static_cast<int8_t>(((qs[32 * h + l] >> (2 * s)) & 3) - 4 + 4 * ((hmask[l] >> bit) & 1));
          }
        }
      }
    }
  }
};

// Q4_K: each 64 elements are 32 bytes of qs, low nibbles first; sub-block i has scale d * sc_i
// and min dmin * m_i.
struct q4_k_codes : code_traits<dtype::q4_k, 256, 144, 32, 0, 15, true> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = read_f16(block);
      const float dmin = read_f16(block + 2);
      const uint8_t* packed = bytes_at(block + 4);
      const uint8_t* q = bytes_at(block + 16);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        quant::k_scale_min(s, packed, &sc, &m);
        D[b * 8 + s] = d * static_cast<float>(sc);
        M[b * 8 + s] = -(dmin * static_cast<float>(m));
      }
      int8_t* c = codes + b * 256;
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; ++l) {
          c[64 * i + l] = static_cast<int8_t>(q[32 * i + l] & 0x0f);
          c[64 * i + 32 + l] = static_cast<int8_t>(q[32 * i + l] >> 4);
        }
      }
    }
  }
};

// Q5_K: Q4_K plus a 5th bit: element 64 i + l takes bit 2i of qh[l], element 64 i + 32 + l bit 2i + 1.
struct q5_k_codes : code_traits<dtype::q5_k, 256, 176, 32, 0, 31, true> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float* M) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = read_f16(block);
      const float dmin = read_f16(block + 2);
      const uint8_t* packed = bytes_at(block + 4);
      const uint8_t* qh = bytes_at(block + 16);
      const uint8_t* ql = bytes_at(block + 48);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        quant::k_scale_min(s, packed, &sc, &m);
        D[b * 8 + s] = d * static_cast<float>(sc);
        M[b * 8 + s] = -(dmin * static_cast<float>(m));
      }
      int8_t* c = codes + b * 256;
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; ++l) {
          c[64 * i + l] = static_cast<int8_t>((ql[32 * i + l] & 0x0f) | (((qh[l] >> (2 * i)) & 1) << 4));
          c[64 * i + 32 + l] = static_cast<int8_t>((ql[32 * i + l] >> 4) | (((qh[l] >> (2 * i + 1)) & 1) << 4));
        }
      }
    }
  }
};

// Q6_K: each half of 128 elements has 64 bytes of ql and 32 of qh: for l < 32, elements l,
// l + 32, l + 64, l + 96 are ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high nibbles with
// bits 0-1, 2-3, 4-5, 6-7 of qh[l] on top, minus 32; scale d * sc[e / 16].
struct q6_k_codes : code_traits<dtype::q6_k, 256, 210, 16, -32, 31, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
      const float d = read_f16(block + 208);
      for (int s = 0; s < 16; ++s) D[b * 16 + s] = d * static_cast<float>(sc[s]);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = bytes_at(block + 64 * h);
        const uint8_t* qh = bytes_at(block + 128 + 32 * h);
        int8_t* c = codes + b * 256 + 128 * h;
        for (int l = 0; l < 32; ++l) {
          c[l] = static_cast<int8_t>(((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32);
          c[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
          c[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          c[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
    }
  }
};

struct iq4_nl_codes : code_traits<dtype::iq4_nl, 32, 18, 32, -127, 113, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = read_f16(block);
      const uint8_t* qs = bytes_at(block + 2);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = quant::iq4_levels[qs[j] & 0x0f];
        c[j + 16] = quant::iq4_levels[qs[j] >> 4];
      }
    }
  }
};

struct iq4_xs_codes : code_traits<dtype::iq4_xs, 256, 136, 32, -127, 113, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      const float d = read_f16(block);
      const uint8_t* qs = bytes_at(block + 8);
      for (int s = 0; s < 8; ++s) {
        D[b * 8 + s] = d * static_cast<float>(quant::iq4_xs_sub_scale(block, s));
        int8_t* c = codes + b * 256 + 32 * s;
        for (int j = 0; j < 16; ++j) {
          c[j] = quant::iq4_levels[qs[16 * s + j] & 0x0f];
          c[j + 16] = quant::iq4_levels[qs[16 * s + j] >> 4];
        }
      }
    }
  }
};

struct mxfp4_codes : code_traits<dtype::mxfp4, 32, 17, 32, -12, 12, false> {
  static void decode(const std::byte* src, int64_t num_blocks, int8_t* codes, float* D, float*) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const std::byte* block = src + b * block_bytes;
      D[b] = quant::e8m0_half(bytes_at(block)[0]);
      const uint8_t* qs = bytes_at(block + 1);
      int8_t* c = codes + b * 32;
      for (int j = 0; j < 16; ++j) {
        c[j] = quant::mxfp4_doubled_levels[qs[j] & 0x0f];
        c[j + 16] = quant::mxfp4_doubled_levels[qs[j] >> 4];
      }
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
