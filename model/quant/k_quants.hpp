#pragma once
// The k-quants: super-blocks of 256 elements whose sub-blocks (16 or 32 elements) have their own
// quantized scale (and min), scaled in turn by the super-block's f16 scale(s). Reference
// (scalar, exact) dequantization; the backends' SIMD kernels are tested against these.
//
// Super-block layouts (bytes, little-endian; field sizes in bytes):
//   q2_k  [scales 16][qs 64][d f16][dmin f16]          84   sub-blocks of 16: scale = low nibble,
//         min = high nibble; x = d*scale*q - dmin*min, q 2 bits
//   q3_k  [hmask 32][qs 64][scales 12][d f16]         110   sub-blocks of 16, 6-bit scales - 32;
//         x = d*scale*(q - 4*(1 - high bit)), q's low 2 bits in qs, high bit in hmask
//   q4_k  [d f16][dmin f16][scales 12][qs 128]        144   sub-blocks of 32, 6-bit scale/min;
//         x = d*scale*q - dmin*min, q 4 bits
//   q5_k  [d f16][dmin f16][scales 12][qh 32][qs 128] 176   as q4_k with a 5th bit from qh
//   q6_k  [ql 128][qh 64][scales 16 int8][d f16]      210   sub-blocks of 16; x = d*scale*(q - 32)
// Which bits of qs/qh hold which element is spelled out in each dequantizer (k_quants.cpp); the
// quantizers (k_quantize.cpp) write the same bits.

#include <cstddef>
#include <cstdint>

namespace troupe::quant {

inline constexpr int64_t k_block_size = 256;

// Each writes `count` floats (a multiple of 256) decoded from count / 256 super-blocks.
void dequantize_q2_k(const std::byte* blocks, float* out, int64_t count);
void dequantize_q3_k(const std::byte* blocks, float* out, int64_t count);
void dequantize_q4_k(const std::byte* blocks, float* out, int64_t count);
void dequantize_q5_k(const std::byte* blocks, float* out, int64_t count);
void dequantize_q6_k(const std::byte* blocks, float* out, int64_t count);

// Each writes count / 256 super-blocks for `count` values (a multiple of 256). `weights`
// (nullptr: all equal) weighs each value's squared error: the importance of its column.
void quantize_q2_k(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q3_k(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q4_k(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q5_k(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q6_k(const float* x, std::byte* blocks, int64_t count, const float* weights);

}  // namespace troupe::quant
