// Every CPU op against a naive reference (double accumulation, straight from the definition),
// on every SIMD path this machine has and for every weight dtype.

#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <numbers>
#include <random>
#include <stdexcept>

#include "backends/cpu/embedding.hpp"
#include "backends/cpu/kv_pool.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/paged_attention.hpp"
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
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);   // tie to even
  EXPECT_FLOAT_EQ(f16_to_f32(0xc000), -2.0f);
}

// y = x · wᵀ against double sums, for every dtype, SIMD level, path (row dots / sgemm) and
// several activation counts (one decode token, small batches, a prefill block).
TEST(cpu_matmul, matches_naive_reference_for_every_dtype_and_path) {
  cpu::thread_pool pool(3);
  const int64_t m = 37;
  const int saved_switch = cpu::matmul_gemm_min_rows();
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0}) {
    for (int64_t k : {64, 96, 172}) {
      if (type == dtype::q8_0 && k % 32 != 0) continue;
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
            cpu::set_matmul_gemm_min_rows(gemm_min_rows);
            std::vector<float> y(n * m, -1.0f), scratch;
            cpu::matmul(pool, x.data(), n, w, y.data(), scratch);
            for (int64_t i = 0; i < n * m; ++i) {
              ASSERT_NEAR(y[i], expected[i], 2e-6 * magnitude[i] + 1e-6)
                  << dtype_name(type) << " " << cpu::simd_level_name(level) << " k=" << k
                  << " n=" << n << (gemm_min_rows == 1 ? " sgemm" : " dots") << " at " << i;
            }
          }
        }
      }
    }
  }
  cpu::set_matmul_gemm_min_rows(saved_switch);
}

// Decode batches of f16 weights go through per-thread slabs of converted rows: more rows than
// one slab holds (a remainder slab too), handed out over the pool, give the reference products.
TEST(cpu_matmul, sgemm_over_per_thread_slabs_covers_every_row) {
  cpu::thread_pool pool(3);
  const int64_t m = 300, k = 512, n = 12;  // slabs of 128 rows: 128 + 128 + 44
  const int saved_switch = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(1);
  const auto w_bytes = test::encode(test::random_floats(m * k, 5), dtype::f16);
  const auto w_ref = test::decode_naive(w_bytes, dtype::f16, m * k);
  const auto x = test::random_floats(n * k, 6);
  std::vector<float> y(n * m, -1.0f), scratch;
  cpu::matmul(pool, x.data(), n, cpu::weight_view{dtype::f16, m, k, w_bytes.data(), nullptr, nullptr}, y.data(), scratch);
  cpu::set_matmul_gemm_min_rows(saved_switch);
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
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(out[r * dim + i], x[r * dim + i] * inv * weight[i], 1e-5);
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
  cpu::apply_rope(pool, q.data(), heads * hd, heads, k.data(), kv_heads * hd, kv_heads, tokens, hd,
                  positions.data(), rope);
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

// Sequences with cached context plus new tokens, blocks scattered over the pool; compared with
// softmax(q·kᵀ / sqrt(d)) · v over each sequence's tokens laid out contiguously.
TEST(cpu_paged_attention, matches_naive_causal_gqa_attention) {
  cpu::thread_pool pool(3);
  model_config config;
  config.num_layers = 1;
  config.num_heads = 6;
  config.num_kv_heads = 2;
  config.head_dim = 20;
  const int block_size = 4, num_blocks = 40;
  const int hd = config.head_dim, slot = config.num_kv_heads * hd, q_dim = config.num_heads * hd;
  cpu::kv_pool kv(config, {num_blocks, block_size});

  const std::vector<int> context = {5, 1, 37, 18};
  const std::vector<int> num_new = {5, 1, 1, 17};
  std::mt19937 rng(42);
  std::vector<int32_t> free_blocks(num_blocks);
  for (int i = 0; i < num_blocks; ++i) free_blocks[i] = i;
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  forward_batch batch;
  batch.query_start.push_back(0);
  batch.block_table_start.push_back(0);
  std::vector<std::vector<float>> seq_k, seq_v;  // [context, slot] per sequence
  for (size_t s = 0; s < context.size(); ++s) {
    const int blocks = (context[s] + block_size - 1) / block_size;
    for (int b = 0; b < blocks; ++b) {
      batch.block_tables.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    seq_k.push_back(test::random_floats(context[s] * slot, 100 + s));
    seq_v.push_back(test::random_floats(context[s] * slot, 200 + s));
    std::vector<int64_t> slots(context[s]);
    for (int t = 0; t < context[s]; ++t) {
      slots[t] = int64_t{batch.block_tables[batch.block_table_start.back() + t / block_size]} * block_size + t % block_size;
    }
    kv.write(0, seq_k[s].data(), seq_v[s].data(), slot, slots.data(), context[s]);
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
    batch.query_start.push_back(batch.query_start.back() + num_new[s]);
    batch.context_lengths.push_back(context[s]);
  }
  const int tokens = batch.query_start.back();
  batch.token_ids.assign(tokens, 0);
  const auto q = test::random_floats(tokens * q_dim, 300);
  const cpu::attention_shape shape{config.num_heads, config.num_kv_heads, hd, block_size, num_blocks,
                                   1.0f / std::sqrt(float(hd))};
  cpu::check_attention_batch(batch, shape);

  std::vector<double> expected(tokens * q_dim);
  for (size_t s = 0; s < context.size(); ++s)
    for (int i = 0; i < num_new[s]; ++i) {
      const int row = batch.query_start[s] + i;
      const int visible = context[s] - num_new[s] + i + 1;
      for (int h = 0; h < config.num_heads; ++h) {
        const int g = h / (config.num_heads / config.num_kv_heads);
        std::vector<double> scores(visible);
        double max_score = -1e300;
        for (int t = 0; t < visible; ++t) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[row * q_dim + h * hd + d]) * seq_k[s][t * slot + g * hd + d];
          scores[t] = dot / std::sqrt(double(hd));
          max_score = std::max(max_score, scores[t]);
        }
        double total = 0;
        for (double& sc : scores) total += (sc = std::exp(sc - max_score));
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int t = 0; t < visible; ++t) acc += scores[t] * seq_v[s][t * slot + g * hd + d];
          expected[row * q_dim + h * hd + d] = acc / total;
        }
      }
    }
  for (cpu::simd_level level : supported_simd_levels()) {
    scoped_simd_level force(level);
    cpu::attention_workspace workspace;
    std::vector<float> out(tokens * q_dim, -7.0f);
    cpu::paged_attention(pool, q.data(), q_dim, kv.keys(0), kv.values(0), batch, shape, out.data(), q_dim, workspace);
    for (int i = 0; i < tokens * q_dim; ++i)
      ASSERT_NEAR(out[i], expected[i], 2e-5) << cpu::simd_level_name(level) << " at " << i;
  }

  forward_batch short_table = batch;
  short_table.context_lengths[2] = 41;  // needs 11 blocks, has 10
  EXPECT_THROW(cpu::check_attention_batch(short_table, shape), std::runtime_error);
  forward_batch bad_block = batch;
  bad_block.block_tables[0] = num_blocks;
  EXPECT_THROW(cpu::check_attention_batch(bad_block, shape), std::runtime_error);
}

TEST(cpu_kv_pool, writes_slots_in_the_documented_layout) {
  model_config config;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 3;
  cpu::kv_pool kv(config, {4, 2});
  EXPECT_EQ(kv.num_slots(), 8);
  EXPECT_EQ(cpu::kv_pool::bytes_per_block(config, 2), size_t{2 * 2 * 2 * 2 * 3 * 4});
  const std::vector<float> k = {1, 2, 3, 4, 5, 6}, v = {7, 8, 9, 10, 11, 12};
  const int64_t slot = 5;  // block 2, offset 1
  kv.write(1, k.data(), v.data(), 6, &slot, 1);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(kv.keys(1)[(2 * 2 + 1) * 6 + i], k[i]);
    EXPECT_EQ(kv.values(1)[(2 * 2 + 1) * 6 + i], v[i]);
    EXPECT_EQ(kv.keys(0)[(2 * 2 + 1) * 6 + i], 0.0f);
  }
  const int64_t bad = 8;
  EXPECT_THROW(kv.write(0, k.data(), v.data(), 6, &bad, 1), std::runtime_error);
}

}  // namespace
}  // namespace troupe
