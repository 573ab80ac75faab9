// Quantizers of the legacy block types (layouts in legacy_quants.hpp). Each block's scale (and
// offset) is the weighted least-squares best over the codes rounding can give
// (scale_fit.hpp); the f16 fields are then written, and the codes rounded again against the
// values a reader decodes from them, so no code is chosen for a scale the file does not hold.

#include <algorithm>
#include <cmath>

#include "model/quant/block_fields.hpp"
#include "model/quant/legacy_quants.hpp"
#include "model/quant/level_grids.hpp"
#include "model/quant/scale_fit.hpp"

namespace troupe::quant {
namespace {

constexpr int block_size = 32;

const float* weights_at(const float* weights, int64_t offset) { return weights ? weights + offset : nullptr; }

// Writes `value` into an f16 field and returns what a reader decodes from it.
float store_f16(std::byte* field, float value) {
  write_f16(field, value);
  return read_f16(field);
}

// Codes j and j + 16 share byte j of qs: low nibble, high nibble.
void pack_nibbles(const uint8_t* codes /* [32] */, std::byte* qs /* [16] */) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::byte>((codes[j] & 0x0f) | ((codes[j + 16] & 0x0f) << 4));
}

// The fifth bits of 32 codes: bit j of the little-endian 32-bit qh is code j's bit 4.
void pack_fifth_bits(const uint8_t* codes /* [32] */, std::byte* qh /* [4] */) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((codes[j] >> 4) & 1) << j;
  std::memcpy(qh, &bits, 4);
}

// Codes round (x - offset) / scale onto 0 .. max_code (all 0 for a zero scale).
void round_affine(const float* x, int n, float scale, float offset, int max_code, uint8_t* codes) {
  const float inverse = scale != 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    codes[i] = static_cast<uint8_t>(
        round_to_integer(std::clamp((x[i] - offset) * inverse, 0.0f, static_cast<float>(max_code))));
  }
}

// A symmetric type: one f16 scale at byte 0 and codes on `grid`; `pack` writes the codes.
template <typename pack_fn>
void quantize_symmetric(const float* x, std::byte* blocks, int64_t count, const float* weights, const level_grid& grid,
                        size_t block_bytes, pack_fn pack) {
  uint8_t codes[block_size];
  for (int64_t b = 0; b < count / block_size; ++b) {
    const float* xb = x + b * block_size;
    const float* wb = weights_at(weights, b * block_size);
    std::byte* out = blocks + b * static_cast<int64_t>(block_bytes);
    const float d = store_f16(out, fit_scale(xb, wb, block_size, grid, codes));
    round_to_grid(xb, wb, block_size, grid, d, codes);
    pack(codes, out);
  }
}

// A scale-and-minimum type: f16 scale and f16 offset at bytes 0 and 2, codes 0 .. max_code.
template <typename pack_fn>
void quantize_affine(const float* x, std::byte* blocks, int64_t count, const float* weights, int max_code,
                     size_t block_bytes, pack_fn pack) {
  uint8_t codes[block_size];
  for (int64_t b = 0; b < count / block_size; ++b) {
    const float* xb = x + b * block_size;
    std::byte* out = blocks + b * static_cast<int64_t>(block_bytes);
    const scale_and_offset fit =
        fit_scale_offset(xb, weights_at(weights, b * block_size), block_size, max_code, false, codes);
    const float d = store_f16(out, fit.scale);
    const float m = store_f16(out + 2, fit.offset);
    round_affine(xb, block_size, d, m, max_code, codes);
    pack(codes, out);
  }
}

}  // namespace

void quantize_q4_0(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  quantize_symmetric(x, blocks, count, weights, integer_grid<-8, 7>(), 18,
                     [](const uint8_t* codes, std::byte* out) { pack_nibbles(codes, out + 2); });
}

void quantize_q5_0(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  quantize_symmetric(x, blocks, count, weights, integer_grid<-16, 15>(), 22, [](const uint8_t* codes, std::byte* out) {
    pack_fifth_bits(codes, out + 2);
    pack_nibbles(codes, out + 6);
  });
}

void quantize_q8_0(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  // With 255 levels a sweep finds nothing rounding to max|x| / 127 and polishing that scale
  // does not (measured), and Q8_0 is what big models are made of: start there, polish. -128 is
  // left out, as ggml does: kernels may negate a code.
  const level_grid grid = integer_grid<-127, 127>();
  uint8_t codes[block_size];
  for (int64_t b = 0; b < count / block_size; ++b) {
    const float* xb = x + b * block_size;
    const float* wb = weights_at(weights, b * block_size);
    std::byte* out = blocks + b * 34;
    float amax = 0;
    for (int j = 0; j < block_size; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = store_f16(out, polish_scale(xb, wb, block_size, grid, amax / 127.0f, codes));
    round_to_grid(xb, wb, block_size, grid, d, codes);
    for (int j = 0; j < block_size; ++j) out[2 + j] = static_cast<std::byte>(static_cast<int8_t>(codes[j] - 127));
  }
}

void quantize_q4_1(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  quantize_affine(x, blocks, count, weights, 15, 20,
                  [](const uint8_t* codes, std::byte* out) { pack_nibbles(codes, out + 4); });
}

void quantize_q5_1(const float* x, std::byte* blocks, int64_t count, const float* weights) {
  quantize_affine(x, blocks, count, weights, 31, 24, [](const uint8_t* codes, std::byte* out) {
    pack_fifth_bits(codes, out + 4);
    pack_nibbles(codes, out + 8);
  });
}

}  // namespace troupe::quant
