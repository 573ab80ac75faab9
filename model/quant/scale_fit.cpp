#include "model/quant/scale_fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::quant {
namespace {

// A run whose largest magnitude is below this is all zeros (its scale would underflow anyway).
constexpr float negligible = 1e-15f;

// Rounds of "round to the fitted scale, fit the scale again" after the sweep.
constexpr int polish_rounds = 3;

// How many of the sweep's best configurations a scale-and-offset fit polishes. The sweep ranks a
// configuration by the error of its own codes; rounded again to its fitted scale and offset,
// one ranked a little lower may end up better. With at most `few_codes` codes that happens
// often and by much (Q2_K's four levels: up to 20 % in a dense search), and rounding every
// configuration again is cheap, so there each is ranked by its error after rounding again.
// The symmetric fit's ranking is exact within its window.
constexpr int affine_candidates = 4;
constexpr int few_codes = 4;

// The longest run fitted and the most crossings one sweep can hold (on the stack: the
// quantizer calls these once per block on several threads). A value crosses at most
// below + above midpoints of its window (5 for the widest), so 64 values stay within 512.
constexpr int max_values = 64;
constexpr int max_crossings = 512;

// "At inverse scale t, value i's code moves by one, up or down", packed in an integer so the
// sweep's sort compares integers: the bits of t (a positive float orders like its bit
// pattern) above the index and the direction.
using crossing = uint64_t;

crossing make_crossing(float t, int index, bool up) {
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  return (static_cast<uint64_t>(bits) << 32) | (static_cast<uint64_t>(index) << 1) | (up ? 1u : 0u);
}
uint32_t crossing_t(crossing c) { return static_cast<uint32_t>(c >> 32); }
int crossing_index(crossing c) { return static_cast<int>((c >> 1) & 0x7fff); }
int crossing_step(crossing c) { return (c & 1) ? 1 : -1; }

inline float weight_of(const float* w, int i) { return w ? w[i] : 1.0f; }

// Σ w·x·level and Σ w·level² for fixed codes: the least-squares scale is their ratio, and it
// lowers the error Σ w·x² by (Σ w·x·level)² / Σ w·level².
struct symmetric_sums {
  double x_level = 0;
  double level2 = 0;
};

// The sums a scale-and-offset fit needs for fixed codes q.
struct affine_sums {
  double w = 0, wx = 0, wxx = 0, wq = 0, wqq = 0, wxq = 0;
  void add(double weight, double x, double q) {
    w += weight;
    wx += weight * x;
    wxx += weight * x * x;
    wq += weight * q;
    wqq += weight * q * q;
    wxq += weight * x * q;
  }
  void raise(double weight, double x, double from) {  // one code from `from` to from + 1
    wq += weight;
    wqq += weight * (2 * from + 1);
    wxq += weight * x;
  }
};

struct affine_solution {
  double scale = 0;
  double offset = 0;
  double error = 0;
};

// The least-squares (scale, offset) for fixed codes and its error; false when the codes fix no
// positive scale.
bool solve(const affine_sums& s, bool offset_at_most_zero, affine_solution* out) {
  const double det = s.w * s.wqq - s.wq * s.wq;
  double scale = 0, offset = 0;
  bool solved = false;
  if (det > 1e-12 * s.w * s.wqq) {
    scale = (s.w * s.wxq - s.wx * s.wq) / det;
    offset = (s.wqq * s.wx - s.wq * s.wxq) / det;
    solved = true;
  }
  if (offset_at_most_zero && (!solved || offset > 0)) {
    // The constrained optimum lies on the boundary offset = 0.
    if (s.wqq <= 0) return false;
    offset = 0;
    scale = s.wxq / s.wqq;
    solved = true;
  }
  if (!solved || !(scale > 0)) return false;
  out->scale = scale;
  out->offset = offset;
  out->error = s.wxx - 2 * scale * s.wxq - 2 * offset * s.wx + scale * scale * s.wqq + 2 * scale * offset * s.wq +
               offset * offset * s.w;
  return true;
}

// Codes round (x − offset) / scale onto 0 .. max_code; returns Σ w·(x − (scale·q + offset))².
double round_affine(const float* x, const float* w, int n, int max_code, float scale, float offset, uint8_t* codes) {
  const float inverse = 1.0f / scale;
  double error = 0;
  for (int i = 0; i < n; ++i) {
    const float q = round_to_integer(std::clamp((x[i] - offset) * inverse, 0.0f, static_cast<float>(max_code)));
    codes[i] = static_cast<uint8_t>(q);
    const double diff = x[i] - (scale * q + offset);
    error += weight_of(w, i) * diff * diff;
  }
  return error;
}

// The best few (error, scale, offset) offered, lowest error first.
template <int capacity>
struct best_candidates {
  struct entry {
    double error;
    float scale;
    float offset;
  };
  entry items[capacity];
  int count = 0;
  void offer(double error, float scale, float offset) {
    if (count == capacity && error >= items[count - 1].error) return;
    int at = count < capacity ? count++ : count - 1;
    while (at > 0 && items[at - 1].error > error) {
      items[at] = items[at - 1];
      --at;
    }
    items[at] = {error, scale, offset};
  }
};

}  // namespace

sweep_range window_range(const fit_window& window, float extreme, float gap) {
  return {std::max(0.5f * extreme, extreme - window.below * gap), extreme + window.above * gap};
}

float round_to_grid(const float* x, const float* w, int n, const level_grid& grid, float scale, uint8_t* codes) {
  const float inverse = scale != 0 ? 1.0f / scale : 0.0f;
  double error = 0;
  for (int i = 0; i < n; ++i) {
    const int code = grid.nearest(x[i] * inverse);
    codes[i] = static_cast<uint8_t>(code);
    const double diff = x[i] - scale * grid.level(code);
    error += weight_of(w, i) * diff * diff;
  }
  return static_cast<float>(error);
}

float polish_scale(const float* x, const float* w, int n, const level_grid& grid, float scale, uint8_t* codes) {
  double error = round_to_grid(x, w, n, grid, scale, codes);
  uint8_t trial[max_values];
  for (int round = 0; round < polish_rounds && scale != 0; ++round) {
    symmetric_sums fit;
    for (int i = 0; i < n; ++i) {
      const double level = grid.level(codes[i]), weight = weight_of(w, i);
      fit.x_level += weight * x[i] * level;
      fit.level2 += weight * level * level;
    }
    if (fit.level2 <= 0) break;
    const float refit = static_cast<float>(fit.x_level / fit.level2);
    if (refit == scale) break;
    const double refit_error = round_to_grid(x, w, n, grid, refit, trial);
    if (!(refit_error < error)) break;
    scale = refit;
    error = refit_error;
    std::copy(trial, trial + n, codes);
  }
  return scale;
}

float fit_scale(const float* x, const float* w, int n, const level_grid& grid, uint8_t* codes, fit_window window) {
  float amax = 0, max_value = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max_value = x[i];
    }
  }
  const int last = grid.size() - 1;
  if (amax < negligible || last < 1) {
    std::fill(codes, codes + n, static_cast<uint8_t>(grid.nearest(0.0f)));
    return 0.0f;
  }

  // Sweep t·y with y = direction·x over the window, for both signs of the scale; the best
  // configuration has the largest gain (Σ w·y·level)² / Σ w·level² with Σ w·y·level > 0.
  uint8_t current[max_values];
  crossing list[max_crossings];
  double best_gain = 0;
  float best_scale = 0;
  for (int direction : {1, -1}) {
    // The outermost level on the side the largest value lands on, and the gap before it.
    const bool upper = (max_value > 0) == (direction > 0);
    const float extreme = upper ? grid.level(last) : -grid.level(0);
    if (extreme <= 0) continue;
    const float gap = upper ? grid.level(last) - grid.level(last - 1) : grid.level(1) - grid.level(0);
    const sweep_range range = window_range(window, extreme, gap);
    const float t_lo = range.lo / amax;
    const float t_hi = range.hi / amax;

    int count = 0;
    symmetric_sums sums;
    for (int i = 0; i < n; ++i) {
      const float y = static_cast<float>(direction) * x[i];
      const int c = grid.nearest(t_lo * y);
      current[i] = static_cast<uint8_t>(c);
      const double level = grid.level(c), weight = weight_of(w, i);
      sums.x_level += weight * y * level;
      sums.level2 += weight * level * level;
      const float inverse_y = 1.0f / y;
      if (y > 0) {
        for (int k = c + 1; k <= last && count < max_crossings; ++k) {
          const float t = 0.5f * (grid.level(k - 1) + grid.level(k)) * inverse_y;
          if (t > t_hi) break;
          list[count++] = make_crossing(t, i, true);
        }
      } else if (y < 0) {
        for (int k = c - 1; k >= 0 && count < max_crossings; --k) {
          const float t = 0.5f * (grid.level(k) + grid.level(k + 1)) * inverse_y;
          if (t > t_hi) break;
          list[count++] = make_crossing(t, i, false);
        }
      }
    }
    std::sort(list, list + count);
    auto consider = [&] {
      if (sums.x_level <= 0 || sums.level2 <= 0) return;
      const double gain = sums.x_level * sums.x_level / sums.level2;
      if (gain > best_gain) {
        best_gain = gain;
        best_scale = static_cast<float>(direction * sums.x_level / sums.level2);
      }
    };
    consider();
    for (int e = 0; e < count;) {
      const uint32_t t = crossing_t(list[e]);
      for (; e < count && crossing_t(list[e]) == t; ++e) {
        const int i = crossing_index(list[e]);
        const double weight = weight_of(w, i);
        const double from = grid.level(current[i]);
        current[i] = static_cast<uint8_t>(current[i] + crossing_step(list[e]));
        const double to = grid.level(current[i]);
        sums.x_level += weight * direction * x[i] * (to - from);
        sums.level2 += weight * (to * to - from * from);
      }
      consider();
    }
  }
  if (best_scale == 0) {
    // No configuration correlates with x (all weights zero): map the largest value to the extreme.
    best_scale = max_value / std::max(grid.level(last), -grid.level(0));
  }
  return polish_scale(x, w, n, grid, best_scale, codes);
}

scale_and_offset fit_scale_offset(const float* x, const float* w, int n, int max_code, bool offset_at_most_zero,
                                  uint8_t* codes, fit_window window) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (offset_at_most_zero) lo = std::min(lo, 0.0f);
  if (!(hi - lo > negligible)) {
    std::fill(codes, codes + n, uint8_t{0});
    return {0.0f, lo};
  }
  const float range = hi - lo;
  const sweep_range swept = window_range(window, static_cast<float>(max_code), 1.0f);
  const float t_lo = swept.lo / range;
  const float t_hi = swept.hi / range;

  // Codes round (x − lo)·t while t sweeps the window; each crossing of a half-integer raises one.
  uint8_t current[max_values];
  crossing list[max_crossings];
  int count = 0;
  affine_sums sums;
  for (int i = 0; i < n; ++i) {
    const float u = x[i] - lo;
    const int c = static_cast<int>(round_to_integer(std::min(t_lo * u, static_cast<float>(max_code))));
    current[i] = static_cast<uint8_t>(c);
    sums.add(weight_of(w, i), x[i], c);
    if (u <= 0) continue;
    const float inverse_u = 1.0f / u;
    for (int k = c + 1; k <= max_code && count < max_crossings; ++k) {
      const float t = (static_cast<float>(k) - 0.5f) * inverse_u;
      if (t > t_hi) break;
      list[count++] = make_crossing(t, i, true);
    }
  }
  std::sort(list, list + count);
  best_candidates<affine_candidates> best;
  uint8_t rounded[max_values];
  const bool round_each = max_code + 1 <= few_codes;
  auto consider = [&] {
    affine_solution solution;
    if (!solve(sums, offset_at_most_zero, &solution)) return;
    const float scale = static_cast<float>(solution.scale), offset = static_cast<float>(solution.offset);
    best.offer(round_each ? round_affine(x, w, n, max_code, scale, offset, rounded) : solution.error, scale, offset);
  };
  consider();
  for (int e = 0; e < count;) {
    const uint32_t t = crossing_t(list[e]);
    for (; e < count && crossing_t(list[e]) == t; ++e) {
      const int i = crossing_index(list[e]);
      sums.raise(weight_of(w, i), x[i], current[i]);
      ++current[i];
    }
    consider();
  }
  if (best.count == 0) {
    // Every configuration had all codes equal (or no weight): spread the range evenly.
    const float scale = range / static_cast<float>(max_code);
    round_affine(x, w, n, max_code, scale, lo, codes);
    return {scale, lo};
  }

  // Polish each candidate: round to its scale and offset, fit both to those codes, while that helps.
  scale_and_offset best_fit;
  double best_error = std::numeric_limits<double>::infinity();
  for (int k = 0; k < best.count; ++k) {
    scale_and_offset fit{best.items[k].scale, best.items[k].offset};
    double error = round_affine(x, w, n, max_code, fit.scale, fit.offset, current);
    for (int round = 0; round < polish_rounds; ++round) {
      affine_sums refit_sums;
      for (int i = 0; i < n; ++i) refit_sums.add(weight_of(w, i), x[i], current[i]);
      affine_solution refit;
      if (!solve(refit_sums, offset_at_most_zero, &refit)) break;
      const scale_and_offset next{static_cast<float>(refit.scale), static_cast<float>(refit.offset)};
      if (next.scale == fit.scale && next.offset == fit.offset) break;
      const double next_error = round_affine(x, w, n, max_code, next.scale, next.offset, current);
      if (!(next_error < error)) break;
      fit = next;
      error = next_error;
    }
    if (error < best_error) {
      best_error = error;
      best_fit = fit;
    }
  }
  round_affine(x, w, n, max_code, best_fit.scale, best_fit.offset, codes);
  return best_fit;
}

}  // namespace troupe::quant
