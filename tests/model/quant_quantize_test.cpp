// Troupe's quantizers against llama.cpp's own (tests/ggml_oracle.hpp), on the same rows:
//  (a) format: ggml's dequantizer reads the blocks Troupe writes bit for bit as Troupe's does;
//  (b) quality: Troupe's error is within 5 % of ggml's quantizer's. Without an importance
//      vector the error is the plain RMSE and ggml runs as llama-quantize runs it then (its
//      reference quantizers); with one it is the importance-weighted RMSE (what an imatrix asks
//      a quantizer to lower) and ggml gets the same vector. Each row's error is taken relative
//      to the row's norm, so rows of small values count as much as large ones. The ratios are
//      printed per type.
// And the scale searches themselves against a dense search over many trial scales.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/loader/gguf_types.hpp"
#include "model/quant/dequantize.hpp"
#include "model/quant/level_grids.hpp"
#include "model/quant/quantize.hpp"
#include "model/quant/scale_fit.hpp"
#include "tests/ggml_oracle.hpp"
#include "tests/model/quant_test_data.hpp"

namespace troupe {
namespace {

struct type_case {
  dtype type;
  const char* ggml_symbol;  // as ggml's dequantize_row_<symbol> spells it
};

const std::vector<type_case> gguf_quantized = {
    {dtype::q4_0, "q4_0"},   {dtype::q4_1, "q4_1"}, {dtype::q5_0, "q5_0"},     {dtype::q5_1, "q5_1"},
    {dtype::q8_0, "q8_0"},   {dtype::q2_k, "q2_K"}, {dtype::q3_k, "q3_K"},     {dtype::q4_k, "q4_K"},
    {dtype::q5_k, "q5_K"},   {dtype::q6_k, "q6_K"}, {dtype::iq4_nl, "iq4_nl"}, {dtype::iq4_xs, "iq4_xs"},
    {dtype::mxfp4, "mxfp4"},
};

std::vector<std::byte> quantize_rows(dtype type, const std::vector<float>& values, int64_t rows, int64_t per_row,
                                     const float* importance) {
  const size_t row_size = row_bytes(type, per_row);
  std::vector<std::byte> out(row_size * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    quant::quantize_row(type, values.data() + r * per_row, per_row, out.data() + r * row_size, importance);
  }
  return out;
}

// sqrt of the mean over rows of Σ w·(x − y)² / Σ w·x².
double relative_error(const std::vector<float>& x, const std::vector<float>& y, int64_t rows, int64_t per_row,
                      const float* importance) {
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double error = 0, norm = 0;
    for (int64_t i = 0; i < per_row; ++i) {
      const size_t at = static_cast<size_t>(r * per_row + i);
      const double w = importance ? importance[i] : 1.0;
      error += w * (x[at] - y[at]) * (x[at] - y[at]);
      norm += w * x[at] * x[at];
    }
    total += error / norm;
  }
  return std::sqrt(total / static_cast<double>(rows));
}

struct data_set {
  const char* name;
  std::vector<float> values;
};

constexpr int64_t rows = 24, per_row = 1024;

std::vector<data_set> data_sets() {
  return {{"gaussian rows of varied scale, centre and outliers", testing::random_rows(rows, per_row, 11)},
          {"heavy-tailed rows (Student-t 4)", testing::heavy_tailed_rows(rows, per_row, 12)}};
}

TEST(quant_quantize, ggml_reads_the_blocks_troupe_writes_exactly_as_troupe_does) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const auto& oracle = testing::ggml_oracle::instance();
  const std::vector<float> importance = testing::importance_vector(per_row, 3);
  for (const data_set& data : data_sets()) {
    for (const float* weights : {static_cast<const float*>(nullptr), importance.data()}) {
      for (const type_case& c : gguf_quantized) {
        const std::vector<std::byte> blocks = quantize_rows(c.type, data.values, rows, per_row, weights);
        const std::vector<float> theirs = oracle.dequantize(c.ggml_symbol, blocks.data(), rows * per_row);
        std::vector<float> ours(data.values.size());
        quant::dequantize_row(c.type, blocks.data(), ours.data(), rows * per_row);
        size_t first_difference = ours.size();
        for (size_t i = 0; i < ours.size() && first_difference == ours.size(); ++i) {
          if (std::memcmp(&ours[i], &theirs[i], 4) != 0) first_difference = i;
        }
        EXPECT_EQ(first_difference, ours.size())
            << dtype_name(c.type) << " on " << data.name << ": element " << first_difference << " decodes to "
            << ours[first_difference] << ", ggml reads " << theirs[first_difference];
        EXPECT_EQ(quant::first_bad_scale_block(c.type, blocks.data(), rows * per_row), std::nullopt)
            << dtype_name(c.type);
        EXPECT_LT(relative_error(data.values, ours, rows, per_row, nullptr), 0.6) << dtype_name(c.type);
      }
    }
  }
}

TEST(quant_quantize, error_is_within_five_percent_of_ggmls_quantizer) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const auto& oracle = testing::ggml_oracle::instance();
  const std::vector<float> importance = testing::importance_vector(per_row, 5);
  for (const data_set& data : data_sets()) {
    std::printf("%s: relative RMSE, Troupe / ggml = ratio\n", data.name);
    std::printf("  %-7s %-29s %-29s\n", "type", "no importance vector", "importance-weighted");
    for (const type_case& c : gguf_quantized) {
      std::printf("  %-7s", std::string(dtype_name(c.type)).c_str());
      for (const float* weights : {static_cast<const float*>(nullptr), importance.data()}) {
        const std::vector<std::byte> ours_blocks = quantize_rows(c.type, data.values, rows, per_row, weights);
        const std::vector<std::byte> theirs_blocks =
            oracle.quantize(static_cast<uint32_t>(gguf_type_of(c.type)), data.values.data(), rows, per_row,
                            row_bytes(c.type, per_row), weights);
        std::vector<float> ours(data.values.size()), theirs(data.values.size());
        quant::dequantize_row(c.type, ours_blocks.data(), ours.data(), rows * per_row);
        quant::dequantize_row(c.type, theirs_blocks.data(), theirs.data(), rows * per_row);
        const double our_error = relative_error(data.values, ours, rows, per_row, weights);
        const double their_error = relative_error(data.values, theirs, rows, per_row, weights);
        const double ratio = our_error / their_error;
        std::printf(" %.5f / %.5f = %.3f     ", our_error, their_error, ratio);
        EXPECT_LE(ratio, 1.05) << dtype_name(c.type) << " on " << data.name << (weights ? ", importance-weighted" : "");
      }
      std::printf("\n");
    }
  }
}

// The least weighted squared error over a dense set of trial inverse scales spanning the same
// window as the sweep (each followed by a least-squares fit of the scale to the codes it rounds
// to, and the codes rounded again), both signs.
double dense_symmetric_search(const std::vector<float>& x, const std::vector<float>& w, const quant::level_grid& grid) {
  float amax = 0, max_value = 0;
  for (float v : x) {
    if (std::fabs(v) > amax) amax = std::fabs(v), max_value = v;
  }
  const int last = grid.size() - 1;
  double best = std::numeric_limits<double>::infinity();
  std::vector<uint8_t> codes(x.size());
  for (float direction : {1.0f, -1.0f}) {
    const bool upper = (max_value > 0) == (direction > 0);
    const float extreme = upper ? grid.level(last) : -grid.level(0);
    if (extreme <= 0) continue;
    const float gap = upper ? grid.level(last) - grid.level(last - 1) : grid.level(1) - grid.level(0);
    const quant::sweep_range range = quant::window_range({}, extreme, gap);
    for (int step = 0; step <= 3000; ++step) {
      const float t = direction * (range.lo + (range.hi - range.lo) * static_cast<float>(step) / 3000.0f) / amax;
      double xl = 0, ll = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float level = grid.level(grid.nearest(t * x[i]));
        xl += w[i] * x[i] * level;
        ll += w[i] * level * level;
      }
      if (ll <= 0) continue;
      best = std::min<double>(best, quant::round_to_grid(x.data(), w.data(), static_cast<int>(x.size()), grid,
                                                         static_cast<float>(xl / ll), codes.data()));
    }
  }
  return best;
}

TEST(quant_scale_fit, the_sweep_is_never_worse_than_a_dense_search_of_trial_scales) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.1f, 3.0f);
  const std::vector<std::pair<const char*, quant::level_grid>> grids = {
      {"q4_0", quant::integer_grid<-8, 7>()}, {"q3_k", quant::integer_grid<-4, 3>()}, {"iq4", quant::iq4_grid()}};
  for (const auto& [name, grid] : grids) {
    int better = 0;
    for (int run = 0; run < 100; ++run) {
      std::vector<float> x(32), w(32);
      for (int i = 0; i < 32; ++i) {
        x[i] = normal(rng) * (i == run % 32 ? 4.0f : 1.0f);
        w[i] = uniform(rng);
      }
      std::vector<uint8_t> codes(32);
      const float scale = quant::fit_scale(x.data(), w.data(), 32, grid, codes.data());
      const double ours = quant::round_to_grid(x.data(), w.data(), 32, grid, scale, codes.data());
      const double dense = dense_symmetric_search(x, w, grid);
      EXPECT_LE(ours, dense * (1 + 1e-5)) << name << " run " << run;
      if (ours < dense * (1 - 1e-6)) ++better;
    }
    std::printf("%s: the sweep beat 6000 trial scales on %d of 100 runs and tied on the rest\n", name, better);
  }
}

// The scale-and-offset sweep against dense trial scales over its window, the offset anchored at
// the minimum as the sweep's is. Two rankings of a trial: by the error of its own codes at their
// least-squares fit, which the sweep must match exactly (it visits every configuration), and by
// that fit's error after rounding again, which it must match where it ranks that way (four
// codes, Q2_K's) and is reported elsewhere. (1e-4: the fit is returned as floats.)
TEST(quant_scale_fit, the_scale_and_offset_sweep_is_never_worse_than_a_dense_search) {
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.5f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.1f, 3.0f);
  for (int max_code : {3, 15, 31}) {
    for (bool at_most_zero : {false, true}) {
      int dense_better = 0;
      double worst = 1;
      for (int run = 0; run < 60; ++run) {
        std::vector<float> x(32), w(32);
        for (int i = 0; i < 32; ++i) {
          x[i] = normal(rng);
          w[i] = uniform(rng);
        }
        float lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
        if (at_most_zero) lo = std::min(lo, 0.0f);
        std::vector<uint8_t> codes(32);
        const quant::scale_and_offset fit =
            quant::fit_scale_offset(x.data(), w.data(), 32, max_code, at_most_zero, codes.data());
        auto rounded_error = [&](double d, double m) {
          double e = 0;
          for (int i = 0; i < 32; ++i) {
            const double q = std::clamp(std::floor((x[i] - m) / d + 0.5), 0.0, static_cast<double>(max_code));
            e += w[i] * (x[i] - (d * q + m)) * (x[i] - (d * q + m));
          }
          return e;
        };
        if (at_most_zero) {
          EXPECT_LE(fit.offset, 0.0f);
        }
        const double ours = rounded_error(fit.scale, fit.offset);
        double dense_own = std::numeric_limits<double>::infinity(), dense_rounded = dense_own;
        const quant::sweep_range range = quant::window_range({}, static_cast<float>(max_code), 1.0f);
        for (int step = 0; step <= 4000; ++step) {
          const double t = (range.lo + (range.hi - range.lo) * step / 4000.0) / (hi - lo);
          double sw = 0, sx = 0, sxx = 0, sq = 0, sqq = 0, sxq = 0;
          for (int i = 0; i < 32; ++i) {
            const double q = std::clamp(std::floor((x[i] - lo) * t + 0.5), 0.0, static_cast<double>(max_code));
            sw += w[i], sx += w[i] * x[i], sxx += w[i] * x[i] * x[i], sq += w[i] * q, sqq += w[i] * q * q,
                sxq += w[i] * x[i] * q;
          }
          const double det = sw * sqq - sq * sq;
          if (det <= 0) continue;
          double d = (sw * sxq - sx * sq) / det, m = (sqq * sx - sq * sxq) / det;
          if (at_most_zero && m > 0) m = 0, d = sxq / sqq;
          if (d <= 0) continue;
          dense_own = std::min(dense_own, sxx - 2 * d * sxq - 2 * m * sx + d * d * sqq + 2 * d * m * sq + m * m * sw);
          dense_rounded = std::min(dense_rounded, rounded_error(d, m));
        }
        EXPECT_LE(ours, dense_own * (1 + 1e-4)) << "max code " << max_code << " run " << run;
        if (max_code == 3) {
          EXPECT_LE(ours, dense_rounded * (1 + 1e-4)) << "max code 3 run " << run;
        }
        if (ours > dense_rounded * (1 + 1e-5)) ++dense_better, worst = std::max(worst, ours / dense_rounded);
      }
      std::printf(
          "max code %d%s: a dense search rounding each trial again beat the sweep on %d of 60 runs, by at most %.1f "
          "%%\n",
          max_code, at_most_zero ? " (offset <= 0)" : "", dense_better, 100 * (worst - 1));
    }
  }
}

TEST(quant_quantize, zeros_constants_and_tiny_rows_decode_sensibly) {
  for (const type_case& c : gguf_quantized) {
    for (float value : {0.0f, 1.0f, -3.5f, 1e-20f}) {
      std::vector<float> x(256, value);
      std::vector<std::byte> blocks(row_bytes(c.type, 256));
      quant::quantize_row(c.type, x.data(), 256, blocks.data());
      std::vector<float> y(256);
      quant::dequantize_row(c.type, blocks.data(), y.data(), 256);
      for (int i = 0; i < 256; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << dtype_name(c.type) << " value " << value;
        // MXFP4's levels (powers of two times 1, 1.5) are up to a third apart: 3.5 decodes to 3 or 4.
        const float tolerance = c.type == dtype::mxfp4 ? 0.15f : 0.1f;
        EXPECT_NEAR(y[i], value, std::fabs(value) * tolerance + 1e-6f) << dtype_name(c.type) << " value " << value;
      }
    }
  }
}

// fp8_e4m3_b128 (block-scaled FP8 checkpoints) has no ggml counterpart: each block's largest
// magnitude maps to 448, so every value is within E4M3's half step (2^-4 relative) of itself, or
// within the smallest subnormal's half (2^-10 of the scale) near zero.
TEST(quant_quantize, fp8_blocks_round_within_half_an_e4m3_step) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i < 128 ? 1e-3f : i < 256 ? 50.0f : 1.0f);
  x[300] = 0.0f;
  std::vector<std::byte> blocks(row_bytes(dtype::fp8_e4m3_b128, 512));
  quant::quantize_row(dtype::fp8_e4m3_b128, x.data(), 512, blocks.data());
  std::vector<float> y(512);
  quant::dequantize_row(dtype::fp8_e4m3_b128, blocks.data(), y.data(), 512);
  for (int b = 0; b < 4; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[b * 128 + j]));
    const float scale = amax / 448.0f;
    for (int j = 0; j < 128; ++j) {
      const int i = b * 128 + j;
      EXPECT_NEAR(y[i], x[i], std::max(std::fabs(x[i]) * 0.0625f, scale * 0.001f)) << "element " << i;
    }
  }
  EXPECT_EQ(y[300], 0.0f);
}

}  // namespace
}  // namespace troupe
