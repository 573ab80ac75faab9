// The CPU backend on quantized checkpoints' weights: the FP8 row kernels against the reference
// dequantizer at every SIMD level, and matmul / embedding applying a weight's row scales and
// act-order column order (weight_tensor) on every path, against the values weight_rows_f32 defines.

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "backends/cpu/embedding.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "model/quant/dequantize.hpp"
#include "model/quant/fp8.hpp"
#include "model/weight_values.hpp"
#include "tests/backends/cpu_test_support.hpp"

namespace troupe {
namespace {

using test::scoped_simd_level;
using test::supported_simd_levels;

// Random bytes of `type`: FP8 codes never NaN, b128 blocks with random positive scales, f16
// values from random_floats.
std::vector<std::byte> random_bytes(dtype type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  std::vector<std::byte> bytes(row_bytes(type, cols) * rows);
  for (auto& b : bytes) {
    uint8_t v;
    do v = static_cast<uint8_t>(byte(rng));
    while ((type == dtype::fp8_e4m3 || type == dtype::fp8_e4m3_b128) && (v & 0x7f) == 0x7f);
    b = static_cast<std::byte>(v);
  }
  if (type == dtype::fp8_e4m3_b128) {
    for (size_t block = 0; block < bytes.size() / quant::fp8_b128_block_bytes; ++block) {
      const float s = scale(rng);
      std::memcpy(bytes.data() + block * quant::fp8_b128_block_bytes, &s, 4);
    }
  }
  if (type == dtype::f16) return test::encode(test::random_floats(rows * cols, seed), dtype::f16);
  return bytes;
}

TEST(cpu_fp8_kernels, convert_exactly_and_dot_like_the_reference_at_every_simd_level) {
  for (dtype type : {dtype::fp8_e4m3, dtype::fp8_e4m3_b128}) {
    for (int64_t k : {128, 384, 100, 33}) {
      if (k % dtype_block_size(type) != 0) continue;
      const int64_t m = 7;
      const auto w = random_bytes(type, m, k, static_cast<uint32_t>(k));
      std::vector<float> reference(m * k);
      quant::dequantize_row(type, w.data(), reference.data(), m * k);
      for (int64_t n : {1, 2, 3, 4, 5}) {
        const auto x = test::random_floats(n * k, 3 + n);
        for (cpu::simd_level level : supported_simd_levels()) {
          const cpu::row_kernels& kernels = cpu::kernels_for(level);
          std::vector<float> converted(m * k);
          kernels.to_f32[static_cast<int>(type)](w.data(), m * k, converted.data());
          for (int64_t i = 0; i < m * k; ++i) {
            ASSERT_EQ(converted[i], reference[i])
                << dtype_name(type) << " " << cpu::simd_level_name(level) << " at " << i;
          }
          std::vector<float> y(n * m, -1.0f);
          kernels.dot_rows[static_cast<int>(type)](x.data(), n, k, w.data(), k, m, y.data(), m);
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t r = 0; r < m; ++r) {
              double expected = 0, magnitude = 0;
              for (int64_t i = 0; i < k; ++i) {
                expected += double(x[j * k + i]) * reference[r * k + i];
                magnitude += std::fabs(double(x[j * k + i]) * reference[r * k + i]);
              }
              ASSERT_NEAR(y[j * m + r], expected, 2e-6 * magnitude + 1e-7)
                  << dtype_name(type) << " " << cpu::simd_level_name(level) << " k=" << k << " n=" << n;
            }
          }
        }
      }
    }
  }
}

// A weight tensor of `type` with random bytes, optionally with row scales and a column order.
struct test_weight {
  std::shared_ptr<std::vector<std::byte>> bytes;
  weight_tensor tensor;
};

test_weight make_weight(dtype type, int64_t rows, int64_t cols, bool scaled, bool reordered, uint32_t seed) {
  test_weight w;
  w.bytes = std::make_shared<std::vector<std::byte>>(random_bytes(type, rows, cols, seed));
  if (type == dtype::f32) {  // random bytes are no sensible floats
    const auto values = test::random_floats(rows * cols, seed);
    std::memcpy(w.bytes->data(), values.data(), values.size() * 4);
  }
  w.tensor.name = "w";
  w.tensor.type = type;
  w.tensor.shape = {rows, cols};
  w.tensor.data = w.bytes->data();
  w.tensor.num_bytes = w.bytes->size();
  std::mt19937 rng(seed + 1);
  if (scaled) {
    std::uniform_real_distribution<float> scale(0.5f, 4.0f);
    for (int64_t r = 0; r < rows; ++r) w.tensor.row_scales.push_back(r % 2 ? scale(rng) : -scale(rng));
  }
  if (reordered) {
    w.tensor.input_order.resize(cols);
    std::iota(w.tensor.input_order.begin(), w.tensor.input_order.end(), 0);
    std::shuffle(w.tensor.input_order.begin(), w.tensor.input_order.end(), rng);
  }
  return w;
}

// Restores matmul's path switch however the test ends (a failed ASSERT returns early).
struct saved_gemm_switch {
  int rows = cpu::matmul_gemm_min_rows();
  ~saved_gemm_switch() { cpu::set_matmul_gemm_min_rows(rows); }
};

TEST(cpu_quantized_weights, matmul_applies_row_scales_and_column_order_on_every_path) {
  cpu::thread_pool pool(3);
  const saved_gemm_switch saved;
  const int64_t m = 45;
  struct weight_case {
    dtype type;
    int64_t k;
    bool scaled, reordered;
  };
  // (The gather and the scaling are the same code for every type; these types' kernels compute in
  // f32, so the tolerance can stay tight. q4 act-order layers run end to end in
  // cpu_hf_quantized_model_test.cpp.)
  for (const weight_case& c :
       {weight_case{dtype::fp8_e4m3, 160, true, false}, weight_case{dtype::fp8_e4m3, 100, true, true},
        weight_case{dtype::f32, 96, true, true}, weight_case{dtype::f16, 64, false, true},
        weight_case{dtype::fp8_e4m3_b128, 256, false, false}}) {
    const test_weight w = make_weight(c.type, m, c.k, c.scaled, c.reordered, static_cast<uint32_t>(c.k));
    std::vector<float> values(m * c.k);  // [m, k] what the weight stands for
    weight_rows_f32(w.tensor, 0, m, values.data());
    const cpu::weight_view view = cpu::view_of(w.tensor, m, c.k);
    EXPECT_EQ(view.row_scales != nullptr, c.scaled);
    EXPECT_EQ(view.input_order != nullptr, c.reordered);
    for (int64_t n : {1, 3, 9, 130}) {
      const auto x = test::random_floats(n * c.k, 5 + n);
      for (cpu::simd_level level : supported_simd_levels()) {
        scoped_simd_level force(level);
        for (int gemm_min_rows : {1, INT_MAX}) {
          cpu::set_matmul_gemm_min_rows(gemm_min_rows);
          std::vector<float> y(n * m, -1.0f), scratch;
          cpu::matmul(pool, x.data(), n, view, y.data(), scratch);
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t r = 0; r < m; ++r) {
              double expected = 0, magnitude = 0;
              for (int64_t i = 0; i < c.k; ++i) {
                expected += double(x[j * c.k + i]) * values[r * c.k + i];
                magnitude += std::fabs(double(x[j * c.k + i]) * values[r * c.k + i]);
              }
              ASSERT_NEAR(y[j * m + r], expected, 1e-5 * magnitude + 1e-6)
                  << dtype_name(c.type) << " " << cpu::simd_level_name(level) << " n=" << n
                  << (gemm_min_rows == 1 ? " sgemm" : " dots") << " row " << r;
            }
          }
        }
      }
    }
  }
}

TEST(cpu_quantized_weights, embedding_rows_carry_their_scale_and_column_order) {
  cpu::thread_pool pool(2);
  const test_weight table = make_weight(dtype::fp8_e4m3, 20, 64, true, true, 3);
  std::vector<float> values(20 * 64);
  weight_rows_f32(table.tensor, 0, 20, values.data());
  const std::vector<int32_t> tokens = {7, 0, 19, 7};
  std::vector<float> out(tokens.size() * 64);
  cpu::embedding_lookup(pool, cpu::view_of(table.tensor, 20, 64), tokens.data(), 4, out.data());
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(out[t * 64 + c], values[tokens[t] * 64 + c]) << t << ", " << c;
}

TEST(cpu_quantized_weights, view_of_refuses_row_scales_or_orders_that_do_not_fit) {
  test_weight w = make_weight(dtype::fp8_e4m3, 4, 32, true, true, 9);
  w.tensor.row_scales.pop_back();
  EXPECT_THROW(
      {
        try {
          cpu::view_of(w.tensor, 4, 32);
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("'w' has 3 row scales for 4 rows"), std::string::npos) << e.what();
          throw;
        }
      },
      std::runtime_error);
  w = make_weight(dtype::fp8_e4m3, 4, 32, false, true, 9);
  w.tensor.input_order[5] = w.tensor.input_order[6];
  try {
    cpu::view_of(w.tensor, 4, 32);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' has a column order that is not a permutation"), std::string::npos)
        << e.what();
  }
  w = make_weight(dtype::fp8_e4m3, 4, 32, true, false, 9);
  w.tensor.row_scales[2] = NAN;
  try {
    cpu::view_of(w.tensor, 4, 32);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' has a NaN or infinite scale for row 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
