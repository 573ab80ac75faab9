#pragma once
// The level sets the quantizers round onto (scale_fit.hpp's level_grid), one per code width:
// the values of the elements' codes, and those of the sub-block scale codes of the k-quants and
// IQ4_XS. Code k of a grid is what the block stores (for signed grids, the level minus its
// first value), so a fitted code goes into the block as it is.

#include <array>
#include <cstdint>

#include "model/quant/block_fields.hpp"
#include "model/quant/scale_fit.hpp"

namespace troupe::quant {

template <int first, int last>
inline constexpr std::array<float, last - first + 1> integer_levels = [] {
  std::array<float, last - first + 1> values{};
  for (int k = first; k <= last; ++k) values[static_cast<size_t>(k - first)] = static_cast<float>(k);
  return values;
}();

template <int first, int last>
inline level_grid integer_grid() {
  return level_grid{integer_levels<first, last>, true};
}

inline constexpr std::array<float, 16> iq4_level_values = [] {
  std::array<float, 16> values{};
  for (int k = 0; k < 16; ++k) values[static_cast<size_t>(k)] = static_cast<float>(iq4_levels[k]);
  return values;
}();

inline level_grid iq4_grid() { return level_grid{iq4_level_values, false}; }

}  // namespace troupe::quant
