#pragma once
// Types whose 4-bit codes index a table of levels instead of counting steps: IQ4_NL and IQ4_XS
// (a grid fitted to trained weights) and MXFP4 (OCP microscaling: E2M1 values under a
// power-of-two E8M0 scale, as gpt-oss ships its experts). Reference (scalar, exact)
// dequantization; the backends' kernels are tested against these.
//
// Layouts (bytes, little-endian):
//   iq4_nl  [d f16][qs 16]                                   blocks of 32
//           x[j] = d * level[qs[j] & 15], x[j+16] = d * level[qs[j] >> 4]
//   iq4_xs  [d f16][scales_h u16][scales_l 4][qs 128]       super-blocks of 256, 8 sub-blocks
//           of 32, each with a 6-bit scale (low 4 bits in scales_l's nibbles, top 2 in
//           scales_h) minus 32; the sub-block then reads like an iq4_nl block
//   mxfp4   [e u8][qs 16]                                    blocks of 32
//           x[j] = 2^(e-128) * doubled_e2m1[qs[j] & 15], x[j+16] likewise with qs[j] >> 4

#include <cstddef>
#include <cstdint>

namespace troupe::quant {

void dequantize_iq4_nl(const std::byte* blocks, float* out, int64_t count);
void dequantize_iq4_xs(const std::byte* blocks, float* out, int64_t count);
void dequantize_mxfp4(const std::byte* blocks, float* out, int64_t count);

// The 6-bit scale (minus 32) of sub-block `sub_block` (0..7) of an IQ4_XS super-block.
int iq4_xs_scale(const std::byte* block, int sub_block);

// Quantizers (nonlinear_quantize.cpp): each writes the blocks of `count` values (whole blocks),
// `weights` (nullptr: all equal) weighing each value's squared error.
void quantize_iq4_nl(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_iq4_xs(const float* x, std::byte* blocks, int64_t count, const float* weights);
void quantize_mxfp4(const float* x, std::byte* blocks, int64_t count, const float* weights);

}  // namespace troupe::quant
