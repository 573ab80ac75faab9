#pragma once
// The two searches every quantizer here is built from: for a run of values x with weights w, the
// scale (and offset) whose rounding onto a set of levels leaves the least weighted squared error
// Σ w·(x − decoded)².
//
// Both sweep the inverse scale t across a window around t0, the t that puts the largest value
// on the outermost level. While t moves, a value's nearest level changes only where t·x crosses
// a midpoint between two levels; between two such crossings the codes are fixed, and the best
// scale for fixed codes is a closed-form weighted least-squares fit. Visiting every crossing in
// order therefore finds the best codes in the window exactly, where a grid of trial scales
// samples the same curve at fixed points and can step over the best interval. A few rounds of
// "re-round with the fitted scale, fit again" then follow the fit outside the window (neither
// step can raise the error).
//
// The window reaches further above t0 than below: above t0 the largest values clip to the
// outermost level, which pays when they are rare outliers (every other value then gets a finer
// step); below t0 the outermost level goes unused, which rarely pays. It is measured in gaps
// between the outermost levels, so a sweep visits about as many crossings (three per value at
// most) whatever the grid: a dozen levels or 255.

#include <algorithm>
#include <cstdint>
#include <span>

namespace troupe::quant {

// v rounded to the nearest integer (ties to even), for |v| < 2^22: adding 1.5·2^23 leaves no
// fraction bits. Portable code has no rounding instruction before SSE4.1 (std::floor and
// std::nearbyint become library calls), and rounding is most of a quantizer's inner loop.
inline float round_to_integer(float v) {
  constexpr float magic = 12582912.0f;
  return (v + magic) - magic;
}

// The values a code selects, in ascending order; code k decodes to scale * values[k].
struct level_grid {
  std::span<const float> values;
  bool consecutive_integers = false;  // values[k] == values[0] + k: nearest() rounds directly

  float level(int code) const { return values[static_cast<size_t>(code)]; }
  int size() const { return static_cast<int>(values.size()); }
  // The code whose level is nearest to v.
  int nearest(float v) const {
    const int last = size() - 1;
    if (consecutive_integers) {
      const float k = round_to_integer(std::clamp(v - values[0], -1.0f, static_cast<float>(last) + 1.0f));
      return k <= 0 ? 0 : k >= static_cast<float>(last) ? last : static_cast<int>(k);
    }
    if (v <= values[0]) return 0;
    if (v >= level(last)) return last;
    int lo = 0, hi = last;  // level(lo) < v < level(hi)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (v < level(mid)) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    return v - level(lo) <= level(hi) - v ? lo : hi;
  }
};

// The swept range of t·max|x| (symmetric fit) or t·(max − min) (scale-and-offset fit), in
// outermost gaps around the outermost level E: [E − below·gap, E + above·gap] (never below E/2).
struct fit_window {
  float below = 1.0f;
  float above = 2.0f;
};

// Runs are at most 64 values long (a block, a sub-block, or a super-block's sub-block scales).

// x[i] ≈ scale · grid.level(codes[i]) for i < n, with weights w (nullptr: all 1); both signs of
// the scale are tried. Returns the best-fitting scale (0 for a run of zeros, codes then at the
// level nearest 0).
float fit_scale(const float* x, const float* w, int n, const level_grid& grid, uint8_t* codes, fit_window window = {});

// x[i] ≈ scale · codes[i] + offset with codes in [0, max_code] and scale ≥ 0, weights w (nullptr:
// all 1). With `offset_at_most_zero` the offset is kept ≤ 0, as the k-quants store a non-negative
// minimum that is subtracted.
struct scale_and_offset {
  float scale = 0;
  float offset = 0;
};
scale_and_offset fit_scale_offset(const float* x, const float* w, int n, int max_code, bool offset_at_most_zero,
                                  uint8_t* codes, fit_window window = {});

// The window's range of t·max|x| (or t·range) for an outermost level `extreme` whose gap to its
// neighbour is `gap`.
struct sweep_range {
  float lo, hi;
};
sweep_range window_range(const fit_window& window, float extreme, float gap);

// From `scale`: round x onto the grid, fit the scale to those codes by least squares, and repeat
// while the error falls (a few rounds). Returns the scale, codes[] its rounding.
float polish_scale(const float* x, const float* w, int n, const level_grid& grid, float scale, uint8_t* codes);

// Σ w·(x − scale·level(codes))² and the codes nearest x / scale (all at the level nearest 0 when
// scale is 0), the scale used exactly as given.
float round_to_grid(const float* x, const float* w, int n, const level_grid& grid, float scale, uint8_t* codes);

}  // namespace troupe::quant
