#pragma once
// The legacy GGUF block types: 32 elements a block, one f16 scale (and a min for the _1 types).
// Reference (scalar, exact) dequantization; the backends have their own SIMD kernels, which are
// tested against these. The quantizers are in legacy_quantize.cpp.
//
// Block layouts (bytes, little-endian):
//   q4_0  [d f16][qs 16]            x[j] = d * ((qs[j] & 15) - 8),  x[j+16] = d * ((qs[j] >> 4) - 8)
//   q4_1  [d f16][m f16][qs 16]     x[j] = d * (qs[j] & 15) + m,    x[j+16] = d * (qs[j] >> 4) + m
//   q5_0  [d f16][qh 4][qs 16]      5th bit of element j is bit j of the 32-bit qh; offset 16
//   q5_1  [d f16][m f16][qh 4][qs 16]
//   q8_0  [d f16][qs 32 int8]       x[j] = d * qs[j]

#include <cstddef>
#include <cstdint>

namespace troupe::quant {

// Each writes `count` floats (a multiple of 32) decoded from count / 32 blocks at `blocks`.
void dequantize_q4_0(const std::byte* blocks, float* out, int64_t count);
void dequantize_q4_1(const std::byte* blocks, float* out, int64_t count);
void dequantize_q5_0(const std::byte* blocks, float* out, int64_t count);
void dequantize_q5_1(const std::byte* blocks, float* out, int64_t count);
void dequantize_q8_0(const std::byte* blocks, float* out, int64_t count);

// Each writes count / 32 blocks for `count` values (a multiple of 32). `weights` (nullptr: all
// equal) weighs each value's squared error: the importance of its column, from an imatrix.
void quantize_q4_0(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q4_1(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q5_0(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q5_1(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_q8_0(const float* x, std::byte* blocks, int64_t count, const float* weights);

}  // namespace troupe::quant
