// Quantizers of the table-level types (layouts in nonlinear_quants.hpp): IQ4_NL and IQ4_XS fit
// their scales over the non-linear grid exactly as the uniform types do over theirs (the sweep
// of scale_fit.hpp works for any ascending levels); MXFP4's scale is a power of two, so the
// three exponents around the one that fits the largest value are simply all tried.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/quant/block_fields.hpp"
#include "model/quant/level_grids.hpp"
#include "model/quant/nonlinear_quants.hpp"
#include "model/quant/super_block_fit.hpp"

namespace troupe::quant {
namespace {

const float* weights_at(const float* weights, int64_t offset) { return weights ? weights + offset : nullptr; }

// 32 codes as 16 bytes: codes j and j + 16 share byte j (low, high nibble).
void pack_nibbles(const uint8_t* codes /* [32] */, std::byte* qs /* [16] */) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::byte>((codes[j] & 0x0f) | ((codes[j + 16] & 0x0f) << 4));
}

// MXFP4's fifteen distinct doubled E2M1 values in ascending order, and the nibble of each
// (negative zero, nibble 8, is never needed).
constexpr std::array<float, 15> mxfp4_sorted_levels = {-12, -8, -6, -4, -3, -2, -1, 0, 1, 2, 3, 4, 6, 8, 12};
constexpr std::array<uint8_t, 15> mxfp4_nibble_of = {15, 14, 13, 12, 11, 10, 9, 0, 1, 2, 3, 4, 5, 6, 7};

}  // namespace

void quantize_iq4_nl(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  const level_grid grid = iq4_grid();
  uint8_t codes[32];
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* xb = x + b * 32;
    const float* wb = weights_at(weights, b * 32);
    std::byte* block = blocks + b * 18;
    write_f16(block, fit_scale(xb, wb, 32, grid, codes));
    round_to_grid(xb, wb, 32, grid, read_f16(block), codes);
    pack_nibbles(codes, block + 2);
  }
}

void quantize_iq4_xs(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  symmetric_super_block fit;
  for (int64_t b = 0; b < count / 256; ++b) {
    std::byte* block = blocks + b * 136;
    fit_symmetric_super_block(x + b * 256, weights_at(weights, b * 256), 32, iq4_grid(), integer_grid<-32, 31>(), block,
                              &fit);
    // Scale code u = scale + 32 (0 .. 63): low 4 bits in nibble j % 2 of scales_l[j / 2], top 2
    // bits at bits 2j of scales_h.
    uint16_t scales_h = 0;
    uint8_t scales_l[4] = {0, 0, 0, 0};
    for (int j = 0; j < 8; ++j) {
      const uint8_t u = fit.scale_codes[j];
      scales_l[j / 2] |= static_cast<uint8_t>((u & 0x0f) << (4 * (j % 2)));
      scales_h |= static_cast<uint16_t>((u >> 4) << (2 * j));
    }
    std::memcpy(block + 2, &scales_h, 2);
    std::memcpy(block + 4, scales_l, 4);
    for (int j = 0; j < 8; ++j) pack_nibbles(fit.codes + 32 * j, block + 8 + 16 * j);
  }
}

void quantize_mxfp4(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  const level_grid grid{mxfp4_sorted_levels, false};
  uint8_t codes[32], trial[32];
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* xb = x + b * 32;
    const float* wb = weights_at(weights, b * 32);
    std::byte* block = blocks + b * 17;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    // The exponent that puts the largest value in [8, 16) doubled units (the top level is 12),
    // and its neighbours: one clips less, the other resolves the small values finer.
    int exponent = 0;
    if (amax > 0) exponent = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
    float best = std::numeric_limits<float>::infinity();
    uint8_t best_exponent = 0;
    for (int e = std::max(0, exponent - 1); e <= std::min(254, exponent + 1); ++e) {
      const float error = round_to_grid(xb, wb, 32, grid, e8m0_half(static_cast<uint8_t>(e)), trial);
      if (error < best) {
        best = error;
        best_exponent = static_cast<uint8_t>(e);
        std::copy(trial, trial + 32, codes);
      }
    }
    block[0] = static_cast<std::byte>(best_exponent);
    for (int i = 0; i < 32; ++i) codes[i] = mxfp4_nibble_of[codes[i]];
    pack_nibbles(codes, block + 1);
  }
}

}  // namespace troupe::quant
