// The integer kernels of the quantized weight types (backends/cpu/quant_kernels.hpp), on every
// SIMD level this CPU has, against the reference dequantizer (model/quant, itself bit-exact
// against llama.cpp's) and double-precision dots.
//
// Tolerances. The kernels quantize each 32 activations to x̂ = d q with d = max|x| / 127 and q
// rounded to nearest, so |x - x̂| <= d / 2 element by element, and against the f32 activations
//     |y - Σ w x| <= Σ_b (d_b / 2) Σ_{i in b} |w_i|                                      (loose)
// plus f32 rounding. Against the quantized activations x̂ only the kernel's f32 steps err: one
// rounding of D·d and one fma per sub-block, S sub-blocks in a row, each term at most
// Σ (|D code| + |M|) |x̂| <= 4 wmax_b Σ |x̂| (wmax_b: the block's largest |w|; codes of random
// blocks span their range, so |D code| and |M| stay within 2 wmax_b and wmax_b), so
//     |y - Σ w x̂| <= (S + 8) u Σ_b 4 wmax_b Σ_{i in b} |x̂_i|,   u = 2^-24             (tight)
// The tight bound is ~1e-6 relative: a wrong scale, code or offset anywhere shows.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backends/cpu/matmul.hpp"
#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/quant_repack.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "tests/backends/cpu_test_support.hpp"
#include "tests/backends/quant_test_support.hpp"

namespace troupe {
namespace {

using test::quantized_types;
using test::scoped_simd_level;
using test::supported_simd_levels;

constexpr double unit_roundoff = 1.0 / (1 << 24);

// Activation rows of varied scale (1e-3 .. 1e2), with outliers and an all-zero block.
std::vector<float> random_activations(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j) {
    const float scale = std::pow(10.0f, static_cast<float>(j % 6) - 3.0f);
    for (int64_t i = 0; i < k; ++i) {
      float v = normal(rng) * scale;
      if (uniform(rng) < 0.02f) v *= 10.0f;
      x[j * k + i] = v;
    }
  }
  if (n > 2 && k >= 64) std::fill(x.begin() + 2 * k + 32, x.begin() + 2 * k + 64, 0.0f);
  return x;
}

std::vector<int64_t> widths_of(dtype type) {
  if (dtype_block_size(type) == 256) return {256, 512, 1024};
  return {32, 64, 288};  // 288: a full chunk of 256 and a partial one
}

struct kernel_run {
  std::vector<cpu::act_block> acts;  // [n, k / 32]
  std::vector<float> y;              // [n, m]
};

kernel_run run_kernels(const cpu::quant_kernels& kernels, dtype type, const std::vector<std::byte>& w, int64_t m,
                       int64_t k, const float* x, int64_t n) {
  kernel_run run;
  run.acts.resize(static_cast<size_t>(n * (k / 32)));
  for (int64_t j = 0; j < n; ++j)
    kernels.quantize_acts[static_cast<int>(type)](x + j * k, k, run.acts.data() + j * (k / 32));
  std::vector<std::byte> scratch(kernels.scratch_bytes(n, k));
  run.y.assign(static_cast<size_t>(n * m), std::numeric_limits<float>::quiet_NaN());
  kernels.matmul[static_cast<int>(type)](w.data(), k, m, run.acts.data(), n, run.y.data(), m, scratch.data());
  return run;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Checks every output of `run` against both bounds (see the top of the file).
void expect_within_bounds(dtype type, const std::vector<float>& w, const std::vector<float>& x, const kernel_run& run,
                          int64_t m, int64_t k, int64_t n, const std::string& where) {
  const int64_t sub = type == dtype::q2_k || type == dtype::q3_k || type == dtype::q6_k ? 16 : 32;
  const double num_subs = static_cast<double>(k / sub);
  int failures = 0;
  for (int64_t j = 0; j < n && failures < 5; ++j) {
    for (int64_t r = 0; r < m && failures < 5; ++r) {
      double exact = 0, quantized = 0, loose = 0, tight = 0;
      for (int64_t b = 0; b < k / 32; ++b) {
        const cpu::act_block& a = run.acts[j * (k / 32) + b];
        double amax = 0, wmax = 0, w_abs = 0, xhat_abs = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t e = b * 32 + i;
          const double wi = w[r * k + e], xi = x[j * k + e];
          const double xhat = static_cast<double>(a.d) * a.q[i];
          exact += wi * xi;
          quantized += wi * xhat;
          amax = std::max(amax, std::fabs(xi));
          wmax = std::max(wmax, std::fabs(wi));
          w_abs += std::fabs(wi);
          xhat_abs += std::fabs(xhat);
        }
        loose += amax / 127.0 / 2.0 * w_abs;
        tight += 4.0 * wmax * xhat_abs;
      }
      tight *= (num_subs + 8) * unit_roundoff;
      const double got = run.y[j * m + r];
      if (!(std::fabs(got - quantized) <= tight + 1e-30) || !(std::fabs(got - exact) <= loose + tight + 1e-30)) {
        ADD_FAILURE() << where << ": row " << j << ", weight row " << r << ": got " << got << ", with the quantized "
                      << "activations " << quantized << " (bound " << tight << "), exact " << exact << " (bound "
                      << loose + tight << ")";
        ++failures;
      }
    }
  }
}

TEST(quant_kernels, every_level_has_a_kernel_for_every_quantized_type_and_none_for_float_types) {
  for (auto level : supported_simd_levels()) {
    const cpu::quant_kernels& kernels = cpu::quant_kernels_for(level);
    for (dtype type : quantized_types()) {
      EXPECT_NE(kernels.matmul[static_cast<int>(type)], nullptr) << dtype_name(type);
      EXPECT_NE(kernels.quantize_acts[static_cast<int>(type)], nullptr) << dtype_name(type);
      EXPECT_NE(kernels.to_f32[static_cast<int>(type)], nullptr) << dtype_name(type);
    }
    for (dtype type : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3}) {
      EXPECT_EQ(kernels.matmul[static_cast<int>(type)], nullptr) << dtype_name(type);
    }
  }
}

TEST(quant_kernels, to_f32_gives_the_reference_dequantizers_floats_bit_for_bit) {
  for (dtype type : quantized_types()) {
    for (int64_t k : widths_of(type)) {
      const int64_t rows = 3;
      const std::vector<std::byte> blocks = test::random_blocks(type, rows, k, 11 + static_cast<uint32_t>(k));
      const std::vector<float> want = test::dequantized(type, blocks, rows, k);
      for (auto level : supported_simd_levels()) {
        scoped_simd_level scope(level);
        // Through the row kernels' table, as embedding lookups and f32 slabs use it.
        std::vector<float> got(want.size(), -1.0f);
        cpu::active_kernels().to_f32[static_cast<int>(type)](blocks.data(), rows * k, got.data());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(same_bits(got[i], want[i])) << dtype_name(type) << " at " << cpu::simd_level_name(level) << ", k "
                                                  << k << ", element " << i << ": " << got[i] << " vs " << want[i];
        }
      }
    }
  }
}

TEST(quant_kernels, activations_quantize_per_32_to_nearest_with_max_over_127_on_every_level) {
  const int64_t k = 128;
  const std::vector<float> x = random_activations(6, k, 5);
  for (dtype type : {dtype::q4_0, dtype::q4_k, dtype::q6_k, dtype::q2_k}) {
    const bool halves = type == dtype::q6_k || type == dtype::q2_k;
    std::vector<cpu::act_block> first;
    for (auto level : supported_simd_levels()) {
      const cpu::quant_kernels& kernels = cpu::quant_kernels_for(level);
      std::vector<cpu::act_block> acts(6 * k / 32);
      for (int64_t j = 0; j < 6; ++j)
        kernels.quantize_acts[static_cast<int>(type)](x.data() + j * k, k, acts.data() + j * k / 32);
      for (size_t b = 0; b < acts.size(); ++b) {
        const float* xb = x.data() + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const cpu::act_block& a = acts[b];
        ASSERT_TRUE(same_bits(a.d, amax / 127.0f)) << "block " << b;
        int32_t sums[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
          const float want = a.d > 0 ? std::clamp(std::nearbyint(xb[i] / a.d), -127.0f, 127.0f) : 0.0f;
          ASSERT_EQ(a.q[i], static_cast<int>(want)) << dtype_name(type) << " block " << b << " element " << i;
          ASSERT_LE(std::fabs(xb[i] - a.d * a.q[i]), a.d / 2 * (1 + 1e-6));
          sums[i / 16] += a.q[i];
        }
        if (halves) {
          EXPECT_TRUE(same_bits(a.dsum[0], a.d * static_cast<float>(sums[0])));
          EXPECT_TRUE(same_bits(a.dsum[1], a.d * static_cast<float>(sums[1])));
        } else {
          EXPECT_TRUE(same_bits(a.dsum[0], a.d * static_cast<float>(sums[0] + sums[1])));
        }
        // corr is the level's code offset times the sum: a non-negative multiple of it.
        for (int h = 0; h < (halves ? 2 : 1); ++h) {
          const int32_t sum = halves ? sums[h] : sums[0] + sums[1];
          if (sum != 0) {
            EXPECT_EQ(a.corr[h] % sum, 0);
            EXPECT_GE(a.corr[h] / sum, 0);
            EXPECT_LE(a.corr[h] / sum, 128);
          }
        }
      }
      if (first.empty()) first = acts;
      for (size_t b = 0; b < acts.size(); ++b) {
        EXPECT_EQ(std::memcmp(acts[b].q, first[b].q, 32), 0) << cpu::simd_level_name(level) << " block " << b;
      }
    }
  }
}

TEST(quant_kernels, products_match_double_dots_for_every_type_level_row_count_and_width) {
  const int64_t m = 37;  // two tiles of 16 and a ragged one (and 4 of 8 and a ragged one)
  const int64_t max_n = 40;
  for (dtype type : quantized_types()) {
    for (int64_t k : widths_of(type)) {
      const uint32_t seed = 100 + static_cast<uint32_t>(type) * 7 + static_cast<uint32_t>(k);
      const std::vector<std::byte> w = test::random_blocks(type, m, k, seed);
      const std::vector<float> w_ref = test::dequantized(type, w, m, k);
      const std::vector<float> x = random_activations(max_n, k, seed + 1);
      std::vector<float> first_level;
      for (auto level : supported_simd_levels()) {
        const std::string where = std::string(dtype_name(type)) + " at " + std::string(cpu::simd_level_name(level)) +
                                  ", k " + std::to_string(k);
        const cpu::quant_kernels& kernels = cpu::quant_kernels_for(level);
        const kernel_run all = run_kernels(kernels, type, w, m, k, x.data(), max_n);
        expect_within_bounds(type, w_ref, x, all, m, k, max_n, where);
        // Every level computes the same canonical sum: the same bits.
        if (first_level.empty()) first_level = all.y;
        for (size_t i = 0; i < all.y.size(); ++i) {
          ASSERT_TRUE(same_bits(all.y[i], first_level[i]))
              << where << ": output " << i << " differs from the first level's";
        }
        // Any number of rows gives each row the bits it gets among 40: batch invariance.
        for (int64_t n = 1; n < max_n; n = n == 6 ? 8 : n + 1) {
          const kernel_run some = run_kernels(kernels, type, w, m, k, x.data(), n);
          for (int64_t i = 0; i < n * m; ++i) {
            ASSERT_TRUE(same_bits(some.y[i], all.y[i])) << where << ", " << n << " rows: output " << i;
          }
        }
      }
    }
  }
}

TEST(quant_kernels, products_of_blocks_llama_cpp_quantized_match_double_dots) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const int64_t m = 21, k = 512, n = 5;
  const std::vector<float> values = test::random_floats(m * k, 3, 0.05f);
  const std::vector<float> x = random_activations(n, k, 4);
  for (dtype type : quantized_types()) {
    const std::vector<std::byte> w = testing::ggml_oracle::instance().quantize(
        static_cast<uint32_t>(gguf_type_of(type)), values.data(), m, k, row_bytes(type, k));
    const std::vector<float> w_ref = test::dequantized(type, w, m, k);
    for (auto level : supported_simd_levels()) {
      const kernel_run run = run_kernels(cpu::quant_kernels_for(level), type, w, m, k, x.data(), n);
      expect_within_bounds(type, w_ref, x, run, m, k, n,
                           std::string(dtype_name(type)) + " at " + std::string(cpu::simd_level_name(level)));
    }
  }
}

TEST(quant_kernels, a_non_finite_activation_makes_its_rows_outputs_nan) {
  const int64_t m = 20, k = 256, n = 3;
  const std::vector<std::byte> w = test::random_blocks(dtype::q4_k, m, k, 9);
  std::vector<float> x = random_activations(n, k, 10);
  x[1 * k + 77] = std::numeric_limits<float>::infinity();
  x[2 * k + 200] = std::numeric_limits<float>::quiet_NaN();
  for (auto level : supported_simd_levels()) {
    const kernel_run run = run_kernels(cpu::quant_kernels_for(level), dtype::q4_k, w, m, k, x.data(), n);
    for (int64_t r = 0; r < m; ++r) {
      EXPECT_TRUE(std::isfinite(run.y[0 * m + r])) << cpu::simd_level_name(level);
      EXPECT_TRUE(std::isnan(run.y[1 * m + r])) << cpu::simd_level_name(level);
      EXPECT_TRUE(std::isnan(run.y[2 * m + r])) << cpu::simd_level_name(level);
    }
  }
}

// cpu::matmul itself: any thread count, any split of rows, every strategy's row count.
TEST(quant_kernels, matmul_gives_the_same_bits_for_any_thread_count_and_row_count) {
  const int64_t m = 100, k = 512;
  for (dtype type : {dtype::q4_0, dtype::q8_0, dtype::q4_k, dtype::q6_k, dtype::iq4_xs}) {
    const std::vector<std::byte> bytes = test::random_blocks(type, m, k, 21);
    const cpu::weight_view w{type, m, k, bytes.data()};
    for (auto level : supported_simd_levels()) {
      scoped_simd_level scope(level);
      std::vector<float> want;
      for (int64_t n : {1, 3, 9, 130}) {
        const std::vector<float> x = random_activations(n, k, 22);
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          cpu::thread_pool pool(threads);
          std::vector<float> scratch;
          std::vector<float> y(static_cast<size_t>(n * m));
          cpu::matmul(pool, x.data(), n, w, y.data(), scratch);
          if (first.empty()) first = y;
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_TRUE(same_bits(y[i], first[i])) << dtype_name(type) << " at " << cpu::simd_level_name(level) << ", "
                                                   << n << " rows, " << threads << " threads: output " << i;
          }
        }
        // Row 0 is the same row of x whatever n is.
        if (want.empty()) want.assign(first.begin(), first.begin() + m);
        for (int64_t r = 0; r < m; ++r)
          ASSERT_TRUE(same_bits(first[r], want[r])) << dtype_name(type) << ", " << n << " rows";
      }
    }
  }
}

// Weights repacked at load (backends/cpu/quant_repack.hpp): the repacked kernel, called directly
// on the repacked tiles, gives the GGUF kernel's bits for every row count (1 .. 40, the few-row
// and the many-row schedules) and width, on every level that repacks; through matmul, for any
// thread count and a ragged last tile.
TEST(quant_repack, repacked_products_have_the_gguf_kernels_bits) {
  const int64_t m = 37;
  const int64_t max_n = 40;
  int levels_checked = 0;
  for (dtype type : quantized_types()) {
    if (!cpu::has_repacked_layout(type)) continue;
    const std::vector<int64_t> widths =
        dtype_block_size(type) == 256 ? std::vector<int64_t>{256, 512, 2816} : std::vector<int64_t>{32, 288, 2816};
    for (int64_t k : widths) {
      const uint32_t seed = 300 + static_cast<uint32_t>(k);
      const std::vector<std::byte> w = test::random_blocks(type, m, k, seed);
      const std::vector<float> x = random_activations(max_n, k, seed + 1);
      for (auto level : supported_simd_levels()) {
        const cpu::quant_kernels& kernels = cpu::quant_kernels_for(level);
        if (kernels.repack_rows == 0) continue;
        ++levels_checked;
        const std::string where = std::string(dtype_name(type)) + " at " + std::string(cpu::simd_level_name(level)) +
                                  ", k " + std::to_string(k);
        cpu::thread_pool pool(1);
        const cpu::repacked_buffer packed =
            cpu::repack_weights(pool, cpu::weight_view{type, m, k, w.data()}, kernels.repack_rows);
        for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{5}, max_n}) {
          const kernel_run want = run_kernels(kernels, type, w, m, k, x.data(), n);
          std::vector<float> got(static_cast<size_t>(n * m), std::numeric_limits<float>::quiet_NaN());
          kernels.matmul_repacked[static_cast<int>(type)](packed.get(), k, m, want.acts.data(), n, got.data(), m,
                                                          nullptr);
          for (int64_t i = 0; i < n * m; ++i) {
            ASSERT_TRUE(same_bits(got[i], want.y[i])) << where << ", " << n << " rows: output " << i << " is " << got[i]
                                                      << ", the GGUF kernel gives " << want.y[i];
          }
        }
      }
    }
  }
  if (levels_checked == 0) GTEST_SKIP() << "no SIMD level with a repacked layout on this CPU";
}

TEST(quant_repack, matmul_over_repacked_weights_gives_the_same_bits_for_any_thread_and_row_count) {
  const int64_t m = 100, k = 512;
  for (dtype type : {dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs, dtype::q4_0, dtype::q8_0}) {
    const std::vector<std::byte> bytes = test::random_blocks(type, m, k, 31);
    for (auto level : supported_simd_levels()) {
      scoped_simd_level scope(level);
      const cpu::weight_view plain{type, m, k, bytes.data()};
      cpu::weight_view packed = plain;
      cpu::thread_pool setup(2);
      const cpu::repacked_buffer owned = cpu::repack_for_active_level(setup, {&packed});
      if (owned == nullptr) continue;  // the scalar level has no repacked layout
      ASSERT_NE(packed.repacked, nullptr);
      for (int64_t n : {1, 3, 9, 130}) {
        const std::vector<float> x = random_activations(n, k, 32);
        for (int threads : {1, 2, 3}) {
          cpu::thread_pool pool(threads);
          std::vector<float> scratch;
          std::vector<float> want(static_cast<size_t>(n * m)), got(static_cast<size_t>(n * m));
          cpu::matmul(pool, x.data(), n, plain, want.data(), scratch);
          cpu::matmul(pool, x.data(), n, packed, got.data(), scratch);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(same_bits(got[i], want[i])) << dtype_name(type) << " at " << cpu::simd_level_name(level) << ", "
                                                    << n << " rows, " << threads << " threads: output " << i;
          }
        }
      }
    }
  }
}

TEST(quant_repack, types_without_a_layout_and_widths_off_the_super_block_are_refused_by_name) {
  cpu::thread_pool pool(1);
  const std::vector<std::byte> q3 = test::random_blocks(dtype::q3_k, 16, 256, 1);
  try {
    cpu::repack_weights(pool, cpu::weight_view{dtype::q3_k, 16, 256, q3.data()}, 16);
    FAIL() << "q3_k has no repacked layout";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("q3_k"), std::string::npos) << e.what();
  }
  std::vector<std::byte> odd(144 * 16 * 2);
  try {
    cpu::repack_weights(pool, cpu::weight_view{dtype::q4_k, 16, 288, odd.data()}, 16);
    FAIL() << "288 columns are not whole super-blocks";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("288"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
