// Quantizers of the k-quants (layouts in k_quants.hpp): each super-block is fitted in two levels
// (super_block_fit.hpp), then its codes are packed into the bits the dequantizers read.

#include <cstring>

#include "model/quant/k_quants.hpp"
#include "model/quant/level_grids.hpp"
#include "model/quant/super_block_fit.hpp"

namespace troupe::quant {
namespace {

const float* weights_at(const float* weights, int64_t offset) { return weights ? weights + offset : nullptr; }

uint8_t* bytes(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }

// Q2_K and Q3_K keep 2-bit codes alike: element 32 s + l of each half of 128 (l < 32) at bits
// 2s..2s+1 of byte l of that half's 32 bytes.
void pack_two_bit_codes(const uint8_t* codes /* [256], each < 4 */, uint8_t* qs /* [64] */) {
  std::memset(qs, 0, 64);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, s = (e % 128) / 32, l = e % 32;
    qs[32 * half + l] |= static_cast<uint8_t>((codes[e] & 3) << (2 * s));
  }
}

// Q4_K and Q5_K: eight 6-bit scales and mins in 12 bytes, the inverse of k_scale_min().
void pack_scale_min(const uint8_t* scales, const uint8_t* mins, uint8_t* packed /* [12] */) {
  std::memset(packed, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      packed[j] = scales[j];
      packed[j + 4] = mins[j];
    } else {
      packed[j + 4] = static_cast<uint8_t>((scales[j] & 0x0f) | ((mins[j] & 0x0f) << 4));
      packed[j - 4] |= static_cast<uint8_t>((scales[j] >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((mins[j] >> 4) << 6);
    }
  }
}

// Q4_K and Q5_K: the low nibbles of each 64 elements in 32 bytes, the first 32 elements low.
void pack_low_nibbles(const uint8_t* codes /* [256] */, uint8_t* qs /* [128] */) {
  for (int pair = 0; pair < 4; ++pair) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * pair + l] =
          static_cast<uint8_t>((codes[64 * pair + l] & 0x0f) | ((codes[64 * pair + 32 + l] & 0x0f) << 4));
    }
  }
}

}  // namespace

void quantize_q2_k(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  affine_super_block fit;
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    std::byte* block = blocks + b * 84;
    fit_affine_super_block(x + b * k_block_size, weights_at(weights, b * k_block_size), 16, 3, 15, block + 80,
                           block + 82, &fit);
    for (int j = 0; j < 16; ++j) bytes(block)[j] = static_cast<uint8_t>(fit.scale_codes[j] | (fit.min_codes[j] << 4));
    pack_two_bit_codes(fit.codes, bytes(block + 16));
  }
}

void quantize_q3_k(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  symmetric_super_block fit;
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    std::byte* block = blocks + b * 110;
    fit_symmetric_super_block(x + b * k_block_size, weights_at(weights, b * k_block_size), 16, integer_grid<-4, 3>(),
                              integer_grid<-32, 31>(), block + 108, &fit);
    // A code c is the level c - 4: its low 2 bits go to qs, and hmask's bit is set when c >= 4.
    uint8_t* hmask = bytes(block);
    std::memset(hmask, 0, 32);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, s = (e % 128) / 32, l = e % 32;
      if (fit.codes[e] >= 4) hmask[l] |= static_cast<uint8_t>(1u << (4 * half + s));
    }
    pack_two_bit_codes(fit.codes, bytes(block + 32));
    // Sixteen 6-bit scale codes: low nibbles of 0-7 then 8-15 (high nibbles) in bytes 0-7, the top
    // two bits of scale j at bits 2 (j / 4) of byte 8 + j % 4; the inverse of q3_k_scales().
    uint8_t* packed = bytes(block + 96);
    std::memset(packed, 0, 12);
    for (int j = 0; j < 16; ++j) {
      const uint8_t code = fit.scale_codes[j];
      packed[j % 8] |= static_cast<uint8_t>((code & 0x0f) << (j < 8 ? 0 : 4));
      packed[8 + j % 4] |= static_cast<uint8_t>((code >> 4) << (2 * (j / 4)));
    }
  }
}

void quantize_q4_k(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  affine_super_block fit;
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    std::byte* block = blocks + b * 144;
    fit_affine_super_block(x + b * k_block_size, weights_at(weights, b * k_block_size), 32, 15, 63, block, block + 2,
                           &fit);
    pack_scale_min(fit.scale_codes, fit.min_codes, bytes(block + 4));
    pack_low_nibbles(fit.codes, bytes(block + 16));
  }
}

void quantize_q5_k(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  affine_super_block fit;
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    std::byte* block = blocks + b * 176;
    fit_affine_super_block(x + b * k_block_size, weights_at(weights, b * k_block_size), 32, 31, 63, block, block + 2,
                           &fit);
    pack_scale_min(fit.scale_codes, fit.min_codes, bytes(block + 4));
    // The fifth bit of element 64 i + l (l < 32) is bit 2i of qh[l]; of 64 i + 32 + l, bit 2i + 1.
    uint8_t* qh = bytes(block + 16);
    std::memset(qh, 0, 32);
    for (int e = 0; e < 256; ++e) {
      if (fit.codes[e] & 0x10) qh[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    }
    pack_low_nibbles(fit.codes, bytes(block + 48));
  }
}

void quantize_q6_k(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  symmetric_super_block fit;
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    std::byte* block = blocks + b * 210;
    fit_symmetric_super_block(x + b * k_block_size, weights_at(weights, b * k_block_size), 16, integer_grid<-32, 31>(),
                              integer_grid<-128, 127>(), block + 208, &fit);
    uint8_t* ql = bytes(block);
    uint8_t* qh = bytes(block + 128);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* c = fit.codes + 128 * half;  // codes are the levels + 32, 0 .. 63
      for (int l = 0; l < 32; ++l) {
        ql[64 * half + l] = static_cast<uint8_t>((c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4));
        ql[64 * half + l + 32] = static_cast<uint8_t>((c[l + 32] & 0x0f) | ((c[l + 96] & 0x0f) << 4));
        qh[32 * half + l] = static_cast<uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) |
                                                 ((c[l + 96] >> 4) << 6));
      }
    }
    for (int j = 0; j < 16; ++j) block[192 + j] = static_cast<std::byte>(static_cast<int8_t>(fit.scale_codes[j] - 128));
  }
}

}  // namespace troupe::quant
