// Every CPU op against a naive reference (double accumulation, straight from the definition),
// on every SIMD path this machine has and for every weight dtype.

#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <cmath>
#include <numbers>
#include <random>
#include <stdexcept>

#include "backends/cpu/embedding.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "backends/cpu/rms_norm.hpp"
#include "backends/cpu/rope.hpp"
#include "backends/cpu/silu_mul.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/rope_frequencies.hpp"
#include "tests/backends/cpu_test_support.hpp"

namespace troupe {
namespace {

using test::scoped_simd_level;
using test::supported_simd_levels;

TEST(cpu_thread_pool, covers_every_index_once) {
  for (int threads : {1, 2, 3, 7}) {
    cpu::thread_pool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t total : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(total);
      pool.parallel_for(0, total, 1, [&](int64_t b, int64_t e, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      std::vector<std::atomic<int>> dynamic_hits(total);
      pool.parallel_for_dynamic(0, total, 3, [&](int64_t b, int64_t e, int) {
        EXPECT_LE(e - b, 3);
        for (int64_t i = b; i < e; ++i) dynamic_hits[i]++;
      });
      for (auto& h : dynamic_hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(cpu_thread_pool, rethrows_errors_and_stays_usable) {
  cpu::thread_pool pool(3);
  EXPECT_THROW(pool.parallel_for(0, 100, 1,
                                 [](int64_t b, int64_t, int) {
                                   if (b > 0) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(0, 100, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
  EXPECT_GE(cpu::thread_pool(0).num_threads(), 1);
}

TEST(cpu_half_float, round_trips_every_f16_and_bf16_value) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "f16 bits " << bits;
    const float b = bf16_to_f32(h);
    if (std::isnan(b)) continue;
    ASSERT_EQ(f32_to_bf16(b), h) << "bf16 bits " << bits;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie to even
  EXPECT_FLOAT_EQ(f16_to_f32(0xc000), -2.0f);
}

// y = x · wᵀ against double sums, for every float dtype, SIMD level, path (row dots / sgemm) and
// several activation counts (one decode token, small batches, a prefill block). The quantized
// types multiply int8-quantized activations, with a bound of their own: quant_kernels_test.cpp.
TEST(cpu_matmul, matches_naive_reference_for_every_dtype_and_path) {
  cpu::thread_pool pool(3);
  const int64_t m = 37;
  const int saved_switch = cpu::matmul_gemm_min_rows();
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (int64_t k : {64, 96, 172}) {
      const auto w_values = test::random_floats(m * k, 11 + k);
      const auto w_bytes = test::encode(w_values, type);
      const auto w_ref = test::decode_naive(w_bytes, type, m * k);
      const cpu::weight_view w{type, m, k, w_bytes.data(), nullptr, nullptr};
      for (int64_t n : {1, 2, 3, 4, 5, 9, 33}) {
        const auto x = test::random_floats(n * k, 7 + n);
        std::vector<double> expected(n * m), magnitude(n * m);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t r = 0; r < m; ++r)
            for (int64_t i = 0; i < k; ++i) {
              expected[j * m + r] += x[j * k + i] * w_ref[r * k + i];
              magnitude[j * m + r] += std::fabs(x[j * k + i] * w_ref[r * k + i]);
            }
        for (cpu::simd_level level : supported_simd_levels()) {
          scoped_simd_level force(level);
          for (int gemm_min_rows : {1, INT_MAX}) {
            for (bool panels : {true, false}) {
              cpu::set_matmul_gemm_min_rows(gemm_min_rows);
              cpu::set_matmul_float_panels(panels);
              std::vector<float> y(n * m, -1.0f), scratch;
              cpu::matmul(pool, x.data(), n, w, y.data(), scratch);
              for (int64_t i = 0; i < n * m; ++i) {
                ASSERT_NEAR(y[i], expected[i], 2e-6 * magnitude[i] + 1e-6)
                    << dtype_name(type) << " " << cpu::simd_level_name(level) << " k=" << k << " n=" << n
                    << (gemm_min_rows == 1 ? (panels ? " panels" : " sgemm") : " dots") << " at " << i;
              }
            }
          }
        }
      }
    }
  }
  cpu::set_matmul_gemm_min_rows(saved_switch);
  cpu::set_matmul_float_panels(true);
}

// The panel kernels (row_kernels.hpp) at the most rows a level gives them: k in several chunks,
// activation and weight rows that fill no whole tile, and chunks handed out over the pool, against
// double sums; and every output is its products added in k's order, so a row has the same bits
// in a long product (k chunked) as in a short one (k whole).
TEST(cpu_matmul, panel_kernels_cover_chunks_and_tails_with_the_same_bits) {
  cpu::thread_pool pool(3);
  const int64_t m = 45, k = 600, short_n = 33;
  const int saved_switch = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(1);
  for (dtype type : {dtype::f16, dtype::bf16}) {
    const auto w_bytes = test::encode(test::random_floats(m * k, 21), type);
    const auto w_ref = test::decode_naive(w_bytes, type, m * k);
    const cpu::weight_view w{type, m, k, w_bytes.data(), nullptr, nullptr};
    for (cpu::simd_level level : supported_simd_levels()) {
      scoped_simd_level force(level);
      const cpu::row_kernels& kernels = cpu::active_kernels();
      if (kernels.panel_gemm == nullptr) continue;  // the scalar level has none
      // 511 rows on AVX-512 (k in chunks of 128), 127 on AVX2 (512 and 88).
      const int64_t long_n = kernels.panel_max_rows - 1;
      const auto x = test::random_floats(long_n * k, 22);
      std::vector<float> whole(long_n * m, -1.0f), part(short_n * m, -1.0f), scratch;
      cpu::matmul(pool, x.data(), long_n, w, whole.data(), scratch);
      cpu::matmul(pool, x.data(), short_n, w, part.data(), scratch);
      for (int64_t j = 0; j < long_n; j += j < 40 ? 1 : 37) {
        for (int64_t r = 0; r < m; ++r) {
          double expected = 0, magnitude = 0;
          for (int64_t i = 0; i < k; ++i) {
            expected += x[j * k + i] * w_ref[r * k + i];
            magnitude += std::fabs(x[j * k + i] * w_ref[r * k + i]);
          }
          ASSERT_NEAR(whole[j * m + r], expected, 2e-6 * magnitude + 1e-6)
              << dtype_name(type) << " " << cpu::simd_level_name(level) << " row " << r << " of activation " << j;
        }
      }
      EXPECT_EQ(std::memcmp(whole.data(), part.data(), part.size() * 4), 0)
          << dtype_name(type) << " " << cpu::simd_level_name(level);
    }
  }
  cpu::set_matmul_gemm_min_rows(saved_switch);
}

// The row dots give an output the same bits whatever else is computed beside it: any number of
// activation rows, and a weight row dotted in a pair (two rows share the activation loads) or
// alone (the odd row out), on every level.
TEST(cpu_matmul, row_dots_give_each_output_the_same_bits_in_any_batch_and_tile) {
  cpu::thread_pool pool(1);
  const int saved_switch = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(INT_MAX);
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16}) {
    const int64_t m = 7, k = 77;
    const auto w_bytes = test::encode(test::random_floats(m * k, 3), type);
    const auto x = test::random_floats(9 * k, 4);
    for (cpu::simd_level level : supported_simd_levels()) {
      scoped_simd_level force(level);
      std::vector<float> scratch, alone(m);
      // Each weight row by itself (a view of one row: never in a pair), activation row 0 alone.
      for (int64_t r = 0; r < m; ++r) {
        cpu::matmul(pool, x.data(), 1, cpu::weight_view{type, 1, k, w_bytes.data() + row_bytes(type, k) * r}, &alone[r],
                    scratch);
      }
      for (int64_t n = 1; n <= 9; ++n) {
        std::vector<float> y(n * m);
        cpu::matmul(pool, x.data(), n, cpu::weight_view{type, m, k, w_bytes.data()}, y.data(), scratch);
        for (int64_t r = 0; r < m; ++r) {
          ASSERT_EQ(std::memcmp(&y[r], &alone[r], 4), 0)
              << dtype_name(type) << " " << cpu::simd_level_name(level) << ", " << n << " rows, weight row " << r;
        }
      }
    }
  }
  cpu::set_matmul_gemm_min_rows(saved_switch);
}

// Without the panel kernels (or on a level that has none), decode batches of f16 weights go
// through per-thread slabs of converted rows: more rows than one slab holds (a remainder slab
// too), handed out over the pool, give the reference products.
TEST(cpu_matmul, sgemm_over_per_thread_slabs_covers_every_row) {
  cpu::thread_pool pool(3);
  const int64_t m = 300, k = 512, n = 12;  // slabs of 128 rows: 128 + 128 + 44
  const int saved_switch = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(1);
  cpu::set_matmul_float_panels(false);
  const auto w_bytes = test::encode(test::random_floats(m * k, 5), dtype::f16);
  const auto w_ref = test::decode_naive(w_bytes, dtype::f16, m * k);
  const auto x = test::random_floats(n * k, 6);
  std::vector<float> y(n * m, -1.0f), scratch;
  cpu::matmul(pool, x.data(), n, cpu::weight_view{dtype::f16, m, k, w_bytes.data(), nullptr, nullptr}, y.data(),
              scratch);
  cpu::set_matmul_gemm_min_rows(saved_switch);
  cpu::set_matmul_float_panels(true);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r = 0; r < m; ++r) {
      double expected = 0, magnitude = 0;
      for (int64_t i = 0; i < k; ++i) {
        expected += x[j * k + i] * w_ref[r * k + i];
        magnitude += std::fabs(x[j * k + i] * w_ref[r * k + i]);
      }
      ASSERT_NEAR(y[j * m + r], expected, 2e-6 * magnitude + 1e-6) << "row " << r << " of activation " << j;
    }
  }
}

TEST(cpu_matmul, view_of_rejects_wrong_shapes) {
  weight_store store;
  test::add_tensor(store, "w", {4, 8}, test::random_floats(32, 1), dtype::f32);
  EXPECT_NO_THROW(cpu::view_of(store.get("w"), 4, 8));
  try {
    cpu::view_of(store.get("w"), 8, 4);
    FAIL() << "expected a shape error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' has shape [4, 8], expected [8, 4]"), std::string::npos) << e.what();
  }
}

TEST(cpu_rms_norm, matches_naive_reference) {
  cpu::thread_pool pool(2);
  const int64_t rows = 5, dim = 77;
  const auto x = test::random_floats(rows * dim, 3);
  const auto weight = test::random_floats(dim, 4);
  std::vector<float> out(rows * dim);
  cpu::rms_norm(pool, x.data(), rows, dim, weight.data(), 1e-5f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(sum / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) ASSERT_NEAR(out[r * dim + i], x[r * dim + i] * inv * weight[i], 1e-5);
  }
}

TEST(cpu_rope, rotates_halves_by_position) {
  cpu::thread_pool pool(2);
  model_config config;
  config.head_dim = 16;
  config.rope_theta = 10000.0f;
  const rope_parameters rope = rope_for_layer(config, 0);
  const int tokens = 3, heads = 4, kv_heads = 2, hd = 16;
  auto q = test::random_floats(tokens * heads * hd, 5);
  auto k = test::random_floats(tokens * kv_heads * hd, 6);
  const auto q0 = q, k0 = k;
  const std::vector<int32_t> positions = {0, 7, 300};
  cpu::apply_rope(pool, q.data(), heads * hd, heads, k.data(), kv_heads * hd, kv_heads, tokens, hd, positions.data(),
                  rope);
  auto check = [&](const std::vector<float>& before, const std::vector<float>& after, int nh) {
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < nh; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const double angle = positions[t] * std::pow(10000.0, -2.0 * i / hd);
          const size_t base = (t * nh + h) * hd;
          const double x1 = before[base + i], x2 = before[base + i + hd / 2];
          ASSERT_NEAR(after[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-4);
          ASSERT_NEAR(after[base + i + hd / 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-4);
        }
  };
  check(q0, q, heads);
  check(k0, k, kv_heads);
}

TEST(cpu_silu_mul, matches_definition) {
  cpu::thread_pool pool(2);
  const int64_t rows = 3, dim = 50;
  const auto gate = test::random_floats(rows * dim, 8, 4.0f);
  const auto up = test::random_floats(rows * dim, 9);
  std::vector<float> out(rows * dim);
  cpu::silu_mul(pool, gate.data(), up.data(), dim, rows, dim, out.data(), dim);
  for (int64_t i = 0; i < rows * dim; ++i) {
    const double g = gate[i];
    ASSERT_NEAR(out[i], g / (1 + std::exp(-g)) * up[i], 1e-5);
  }
}

TEST(cpu_embedding, looks_up_rows_in_every_dtype) {
  cpu::thread_pool pool(2);
  const int64_t vocab = 10, dim = 64;
  const auto table = test::random_floats(vocab * dim, 10);
  const std::vector<int32_t> ids = {3, 0, 9, 3};
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0}) {
    const auto bytes = test::encode(table, type);
    const auto ref = test::decode_naive(bytes, type, vocab * dim);
    for (cpu::simd_level level : supported_simd_levels()) {
      scoped_simd_level force(level);
      std::vector<float> out(ids.size() * dim);
      cpu::embedding_lookup(pool, {type, vocab, dim, bytes.data()}, ids.data(), ids.size(), out.data());
      for (size_t t = 0; t < ids.size(); ++t)
        for (int64_t i = 0; i < dim; ++i) ASSERT_FLOAT_EQ(out[t * dim + i], ref[ids[t] * dim + i]);
    }
    const int32_t bad = 10;
    std::vector<float> out(dim);
    EXPECT_THROW(cpu::embedding_lookup(pool, {type, vocab, dim, bytes.data()}, &bad, 1, out.data()),
                 std::runtime_error);
  }
}

}  // namespace
}  // namespace troupe
