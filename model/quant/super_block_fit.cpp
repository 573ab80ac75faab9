#include "model/quant/super_block_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/quant/block_fields.hpp"
#include "model/quant/level_grids.hpp"

namespace troupe::quant {
namespace {

// How far (in codes) step 3 looks on each side of a rounded scale or minimum code.
constexpr int neighbourhood = 1;

// The second level's window reaches further: with 8 or 16 scales, a largest one that is an
// outlier may be better clipped.
constexpr fit_window scale_window{1.0f, 4.0f};

const float* at(const float* w, int offset) { return w ? w + offset : nullptr; }
float weight_of(const float* w, int i) { return w ? w[i] : 1.0f; }

float store_f16(std::byte* field, float value) {
  write_f16(field, value);
  return read_f16(field);
}

// Σ w·(x − (dl·q − ml))² with q rounded onto 0 .. max_code, computed as a reader decodes.
double affine_error(const float* x, const float* w, int n, float dl, float ml, int max_code, uint8_t* codes) {
  const float inverse = dl != 0 ? 1.0f / dl : 0.0f;
  double error = 0;
  for (int i = 0; i < n; ++i) {
    const float q = round_to_integer(std::clamp((x[i] + ml) * inverse, 0.0f, static_cast<float>(max_code)));
    codes[i] = static_cast<uint8_t>(q);
    const double diff = static_cast<double>(dl * q - ml) - x[i];
    error += weight_of(w, i) * diff * diff;
  }
  return error;
}

}  // namespace

void fit_symmetric_super_block(const float* x, const float* w, int sub_size, const level_grid& elements,
                               const level_grid& scales, std::byte* d_field, symmetric_super_block* out) {
  const int num_sub = super_block_size / sub_size;
  float sub_scales[16] = {}, importance[16] = {};  // num_sub of them set
  for (int j = 0; j < num_sub; ++j) {
    const float* xs = x + j * sub_size;
    const float* ws = at(w, j * sub_size);
    uint8_t* codes = out->codes + j * sub_size;
    sub_scales[j] = fit_scale(xs, ws, sub_size, elements, codes);
    double sum = 0;
    for (int i = 0; i < sub_size; ++i) sum += weight_of(ws, i) * elements.level(codes[i]) * elements.level(codes[i]);
    importance[j] = static_cast<float>(sum);
  }
  out->d = store_f16(d_field, fit_scale(sub_scales, importance, num_sub, scales, out->scale_codes, scale_window));

  uint8_t trial[32];
  for (int j = 0; j < num_sub; ++j) {
    const float* xs = x + j * sub_size;
    const float* ws = at(w, j * sub_size);
    uint8_t* codes = out->codes + j * sub_size;
    const int rounded = out->scale_codes[j];
    float best = std::numeric_limits<float>::infinity();
    for (int c = std::max(0, rounded - neighbourhood); c <= std::min(scales.size() - 1, rounded + neighbourhood); ++c) {
      const float error = round_to_grid(xs, ws, sub_size, elements, out->d * scales.level(c), trial);
      if (error < best) {
        best = error;
        out->scale_codes[j] = static_cast<uint8_t>(c);
        std::copy(trial, trial + sub_size, codes);
      }
    }
  }
}

void fit_affine_super_block(const float* x, const float* w, int sub_size, int max_code, int max_scale_code,
                            std::byte* d_field, std::byte* dmin_field, affine_super_block* out) {
  const int num_sub = super_block_size / sub_size;
  const level_grid scale_grid{
      std::span<const float>(integer_levels<0, 63>).first(static_cast<size_t>(max_scale_code) + 1), true};
  float sub_scales[16] = {}, sub_mins[16] = {}, scale_importance[16] = {},
        min_importance[16] = {};  // num_sub of them set
  for (int j = 0; j < num_sub; ++j) {
    const float* xs = x + j * sub_size;
    const float* ws = at(w, j * sub_size);
    uint8_t* codes = out->codes + j * sub_size;
    const scale_and_offset fit = fit_scale_offset(xs, ws, sub_size, max_code, true, codes);
    sub_scales[j] = fit.scale;
    sub_mins[j] = -fit.offset;
    double level2 = 0, weight = 0;
    for (int i = 0; i < sub_size; ++i) {
      level2 += weight_of(ws, i) * codes[i] * codes[i];
      weight += weight_of(ws, i);
    }
    scale_importance[j] = static_cast<float>(level2);
    min_importance[j] = static_cast<float>(weight);
  }
  out->d =
      store_f16(d_field, fit_scale(sub_scales, scale_importance, num_sub, scale_grid, out->scale_codes, scale_window));
  out->dmin =
      store_f16(dmin_field, fit_scale(sub_mins, min_importance, num_sub, scale_grid, out->min_codes, scale_window));

  uint8_t trial[32];
  for (int j = 0; j < num_sub; ++j) {
    const float* xs = x + j * sub_size;
    const float* ws = at(w, j * sub_size);
    uint8_t* codes = out->codes + j * sub_size;
    const int rounded_scale = out->scale_codes[j], rounded_min = out->min_codes[j];
    double best = std::numeric_limits<double>::infinity();
    for (int s = std::max(0, rounded_scale - neighbourhood);
         s <= std::min(max_scale_code, rounded_scale + neighbourhood); ++s) {
      for (int m = std::max(0, rounded_min - neighbourhood); m <= std::min(max_scale_code, rounded_min + neighbourhood);
           ++m) {
        const double error = affine_error(xs, ws, sub_size, out->d * static_cast<float>(s),
                                          out->dmin * static_cast<float>(m), max_code, trial);
        if (error < best) {
          best = error;
          out->scale_codes[j] = static_cast<uint8_t>(s);
          out->min_codes[j] = static_cast<uint8_t>(m);
          std::copy(trial, trial + sub_size, codes);
        }
      }
    }
  }
}

}  // namespace troupe::quant
