#pragma once
// The two-level fit of the super-block types (the k-quants and IQ4_XS): 256 values in sub-blocks
// of 16 or 32, each sub-block with its own scale (and minimum), those in turn stored as small
// integer codes times one f16 super-block scale.
//
//   1. each sub-block's best scale (and minimum), alone (scale_fit.hpp);
//   2. the super-block scale that best represents those scales on the code grid, each weighted
//      by how much its error costs: Σ w·level² of its sub-block for a scale, Σ w for a minimum
//      (an error δ in a sub-block's scale moves each value by δ·level, in its minimum by δ);
//   3. each sub-block then takes, among the codes next to the rounded ones, the pair whose
//      decoded values (with the f16 super-block scale as the file holds it) are closest to
//      the originals, its elements rounded again against that decoded scale.
// Step 3 is where most of the gain over rounding each code separately comes from: the codes
// are few bits, and the best decoded sub-block is often one code away from the nearest.

#include <cstddef>
#include <cstdint>

#include "model/quant/scale_fit.hpp"

namespace troupe::quant {

inline constexpr int super_block_size = 256;

// x ≈ d · scales.level(scale_codes[j]) · elements.level(codes[i]), j = i / sub_size.
struct symmetric_super_block {
  float d = 0;                           // as decoded from the f16 field written
  uint8_t scale_codes[16] = {};          // [256 / sub_size]
  uint8_t codes[super_block_size] = {};  // [256]
};

// Writes the f16 super-block scale into `d_field`.
void fit_symmetric_super_block(const float* x /* [256] */, const float* w /* [256] or nullptr */, int sub_size,
                               const level_grid& elements, const level_grid& scales, std::byte* d_field,
                               symmetric_super_block* out);

// x ≈ (d · scale_codes[j]) · codes[i] − (dmin · min_codes[j]), codes in 0 .. max_code, scale and
// min codes in 0 .. max_scale_code.
struct affine_super_block {
  float d = 0, dmin = 0;  // as decoded from the f16 fields written
  uint8_t scale_codes[16] = {};
  uint8_t min_codes[16] = {};
  uint8_t codes[super_block_size] = {};
};

void fit_affine_super_block(const float* x /* [256] */, const float* w /* [256] or nullptr */, int sub_size,
                            int max_code, int max_scale_code, std::byte* d_field, std::byte* dmin_field,
                            affine_super_block* out);

}  // namespace troupe::quant
