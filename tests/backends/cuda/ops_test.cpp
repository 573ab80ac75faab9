// Each elementwise/row op on the GPU against a CPU reference on random inputs, in every
// activation dtype. Outputs are NaN-poisoned first, so an unwritten element fails.

#include <algorithm>
#include <cmath>

#include "backends/cuda/matmul.hpp"
#include "backends/cuda/ops.hpp"
#include "model/kv_transfer.hpp"
#include "model/rope_frequencies.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

TEST(cuda_ops, convert_rounds_like_the_host_and_dequantizes_q8_0) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(1);
  const std::vector<float> values = random_values(1000, rng, 3.0f);
  for (dtype to : activation_types()) {
    device_buffer in = to_device(dtype::f32, values);
    device_buffer out = poisoned(values.size() * element_size(to));
    convert(in.get(), dtype::f32, out.get(), to, values.size(), nullptr);
    EXPECT_EQ(from_device(to, out.get(), values.size()), rounded(to, values)) << dtype_name(to);
  }
  // Q8_0: 4 blocks of (f16 scale, 32 int8).
  std::vector<uint8_t> blocks(4 * 34);
  std::vector<float> expected;
  std::uniform_int_distribution<int> quant(-127, 127);
  for (int b = 0; b < 4; ++b) {
    const float scale = 0.01f * (b + 1);
    const __half h = __float2half_rn(scale);
    std::memcpy(&blocks[b * 34], &h, 2);
    for (int i = 0; i < 32; ++i) {
      const int q = quant(rng);
      blocks[b * 34 + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      expected.push_back(__half2float(h) * static_cast<float>(q));
    }
  }
  device_buffer in = to_device_raw(blocks);
  device_buffer out = poisoned(expected.size() * 4);
  convert(in.get(), dtype::q8_0, out.get(), dtype::f32, expected.size(), nullptr);
  EXPECT_EQ(from_device(dtype::f32, out.get(), expected.size()), expected);
}

TEST(cuda_ops, embedding_gathers_rows) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(2);
  const int vocab = 97, cols = 72, n = 33;
  const std::vector<float> table = random_values(vocab * cols, rng);
  std::vector<int32_t> ids(n);
  for (int& id : ids) id = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
  for (dtype type : activation_types()) {
    device_buffer table_d = to_device(type, table);
    device_buffer ids_d = to_device_raw(ids);
    device_buffer out = poisoned(n * cols * element_size(type));
    embedding(table_d.get(), ids_d.as<int32_t>(), out.get(), n, cols, type, nullptr);
    const std::vector<float> got = from_device(type, out.get(), n * cols);
    const std::vector<float> table_rounded = rounded(type, table);
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < cols; ++c) ASSERT_EQ(got[i * cols + c], table_rounded[ids[i] * cols + c]);
    }
  }
}

TEST(cuda_ops, rms_norm_with_and_without_residual) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (int cols : {64, 1000, 4096}) {
    const int rows = 7;
    const float eps = 1e-5f;
    for (dtype type : activation_types()) {
      const std::vector<float> x = rounded(type, random_values(rows * cols, rng));
      const std::vector<float> res = rounded(type, random_values(rows * cols, rng));
      const std::vector<float> w = rounded(type, random_values(cols, rng, 0.5f));
      for (bool with_residual : {false, true}) {
        device_buffer x_d = to_device(type, x), res_d = to_device(type, res), w_d = to_device(type, w);
        device_buffer out = poisoned(rows * cols * element_size(type));
        rms_norm(x_d.get(), with_residual ? res_d.get() : nullptr, w_d.get(), out.get(), rows, cols, eps, type,
                 nullptr);
        std::vector<double> ref(rows * cols), sum_ref(rows * cols);
        for (int r = 0; r < rows; ++r) {
          double squares = 0.0;
          for (int c = 0; c < cols; ++c) {
            const double v = x[r * cols + c] + (with_residual ? res[r * cols + c] : 0.0);
            sum_ref[r * cols + c] = v;
            squares += v * v;
          }
          const double inv = 1.0 / std::sqrt(squares / cols + eps);
          for (int c = 0; c < cols; ++c) ref[r * cols + c] = sum_ref[r * cols + c] * inv * w[c];
        }
        EXPECT_LT(normalized_error(from_device(type, out.get(), rows * cols), ref), tolerance(type))
            << dtype_name(type) << " cols " << cols << " residual " << with_residual;
        if (with_residual) {
          EXPECT_LT(normalized_error(from_device(type, res_d.get(), rows * cols), sum_ref), tolerance(type));
        }
      }
    }
  }
}

TEST(cuda_ops, rope_rotates_halves_with_optional_qk_norm) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(4);
  const int tokens = 9, heads = 4, kv_heads = 2, head_dim = 64, width = (heads + 2 * kv_heads) * head_dim;
  model_config config;
  config.head_dim = head_dim;
  config.rope_theta = 10000.0f;
  const std::vector<float> inv_freq = rope_inv_freq(config);
  std::vector<int32_t> positions(tokens);
  for (int& p : positions) p = std::uniform_int_distribution<int>(0, 4000)(rng);
  for (dtype type : activation_types()) {
    for (bool norm : {false, true}) {
      const std::vector<float> qkv = rounded(type, random_values(tokens * width, rng));
      const std::vector<float> q_norm = rounded(type, random_values(head_dim, rng)),
                               k_norm = rounded(type, random_values(head_dim, rng));
      device_buffer qkv_d = to_device(type, qkv), pos_d = to_device_raw(positions), freq_d = to_device_raw(inv_freq);
      device_buffer qn = to_device(type, q_norm), kn = to_device(type, k_norm);
      rope(qkv_d.get(), width, pos_d.as<int32_t>(), freq_d.as<float>(), norm ? qn.get() : nullptr,
           norm ? kn.get() : nullptr, 1e-6f, tokens, heads, kv_heads, head_dim, type, nullptr);
      std::vector<double> ref(qkv.begin(), qkv.end());
      for (int t = 0; t < tokens; ++t) {
        for (int h = 0; h < heads + kv_heads; ++h) {
          double* x = &ref[t * width + h * head_dim];
          if (norm) {
            double squares = 0.0;
            for (int d = 0; d < head_dim; ++d) squares += x[d] * x[d];
            const double inv = 1.0 / std::sqrt(squares / head_dim + 1e-6);
            const std::vector<float>& w = h < heads ? q_norm : k_norm;
            for (int d = 0; d < head_dim; ++d) x[d] = x[d] * inv * w[d];
          }
          for (int i = 0; i < head_dim / 2; ++i) {
            const double angle = static_cast<double>(positions[t]) * inv_freq[i];
            const double x1 = x[i], x2 = x[i + head_dim / 2];
            x[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
            x[i + head_dim / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
          }
        }
      }
      // f32 angles at positions in the thousands carry ~1e-4 relative phase error.
      const double allowed = type == dtype::f32 ? 2e-4 : tolerance(type);
      EXPECT_LT(normalized_error(from_device(type, qkv_d.get(), tokens * width), ref), allowed)
          << dtype_name(type) << " norm " << norm;
    }
  }
}

TEST(cuda_ops, silu_and_mul) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int rows = 5, inter = 300;
  for (dtype type : activation_types()) {
    const std::vector<float> gate_up = rounded(type, random_values(rows * 2 * inter, rng, 2.0f));
    device_buffer in = to_device(type, gate_up);
    device_buffer out = poisoned(rows * inter * element_size(type));
    silu_and_mul(in.get(), out.get(), rows, inter, type, nullptr);
    std::vector<double> ref(rows * inter);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < inter; ++i) {
        const double g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
        ref[r * inter + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    EXPECT_LT(normalized_error(from_device(type, out.get(), rows * inter), ref), tolerance(type)) << dtype_name(type);
  }
}

TEST(cuda_ops, kv_cache_store_writes_slots_and_skips_padding) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int tokens = 6, kv_heads = 2, head_dim = 16, num_slots = 32, width = kv_heads * head_dim;
  const int stride = 3 * width;  // rows of a fused qkv buffer: k at +width, v at +2 width
  const std::vector<int64_t> slots{5, 17, -1, 0, 31, 8};
  for (dtype type : activation_types()) {
    const std::vector<float> qkv = rounded(type, random_values(tokens * stride, rng));
    device_buffer qkv_d = to_device(type, qkv), slots_d = to_device_raw(slots);
    device_buffer k_cache = poisoned(num_slots * width * element_size(type));
    device_buffer v_cache = poisoned(num_slots * width * element_size(type));
    const char* base = qkv_d.as<char>();
    kv_cache_store(base + width * element_size(type), base + 2 * width * element_size(type), stride,
                   slots_d.as<int64_t>(), k_cache.get(), v_cache.get(), tokens, kv_heads, head_dim, type, type,
                   nullptr);
    const std::vector<float> k = from_device(type, k_cache.get(), num_slots * width);
    const std::vector<float> v = from_device(type, v_cache.get(), num_slots * width);
    std::vector<bool> written(num_slots, false);
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      written[slots[t]] = true;
      for (int i = 0; i < width; ++i) {
        ASSERT_EQ(k[slots[t] * width + i], qkv[t * stride + width + i]);
        ASSERT_EQ(v[slots[t] * width + i], qkv[t * stride + 2 * width + i]);
      }
    }
    for (int s = 0; s < num_slots; ++s) {
      if (!written[s]) {
        EXPECT_TRUE(std::isnan(k[s * width]) && std::isnan(v[s * width])) << "slot " << s;
      }
    }
  }
}

// A pool of another KV dtype holds exactly the bytes the CPU's reference encoder writes for the
// activations' values (same rounding: nearest even; fp8 saturating; q8_0 scale as f16).
TEST(cuda_ops, kv_cache_store_converts_to_every_kv_dtype) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(7);
  const int tokens = 4, kv_heads = 2, head_dim = 64, num_slots = 8, width = kv_heads * head_dim;
  const std::vector<int64_t> slots{3, 0, -1, 6};
  for (dtype type : activation_types()) {
    std::vector<float> kv = rounded(type, random_values(tokens * 2 * width, rng, 4.0f));
    kv[5] = 1000.0f;  // fp8 saturates
    device_buffer kv_d = to_device(type, kv), slots_d = to_device_raw(slots);
    for (dtype kv_type : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::fp8_e4m3}) {
      const size_t slot_bytes = kv_bytes(kv_type, width);
      device_buffer k_cache = poisoned(num_slots * slot_bytes), v_cache = poisoned(num_slots * slot_bytes);
      const char* base = kv_d.as<char>();
      kv_cache_store(base, base + width * element_size(type), 2 * width, slots_d.as<int64_t>(), k_cache.get(),
                     v_cache.get(), tokens, kv_heads, head_dim, type, kv_type, nullptr);
      std::vector<std::byte> k(num_slots * slot_bytes), v(num_slots * slot_bytes);
      check(cudaMemcpy(k.data(), k_cache.get(), k.size(), cudaMemcpyDeviceToHost), "download k");
      check(cudaMemcpy(v.data(), v_cache.get(), v.size(), cudaMemcpyDeviceToHost), "download v");
      for (int t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        std::vector<std::byte> want(slot_bytes);
        kv_encode_f32(kv_type, kv.data() + t * 2 * width, want.data(), width);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), k.begin() + slots[t] * slot_bytes))
            << dtype_name(type) << " -> " << dtype_name(kv_type) << " K of token " << t;
        kv_encode_f32(kv_type, kv.data() + t * 2 * width + width, want.data(), width);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), v.begin() + slots[t] * slot_bytes))
            << dtype_name(type) << " -> " << dtype_name(kv_type) << " V of token " << t;
      }
    }
  }
}

TEST(cuda_ops, matmul_matches_a_double_reference) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(7);
  matmul mm;
  struct shape {
    int tokens, in, out;
  };
  for (shape s : {shape{1, 64, 172}, shape{5, 256, 96}, shape{37, 512, 1000}}) {
    for (dtype type : activation_types()) {
      for (bool bias : {false, true}) {
        for (dtype out_type : {type, dtype::f32}) {
          const std::vector<float> x = rounded(type, random_values(s.tokens * s.in, rng));
          const std::vector<float> w = rounded(type, random_values(s.out * s.in, rng, 0.05f));
          const std::vector<float> b = rounded(out_type, random_values(s.out, rng));
          device_buffer x_d = to_device(type, x), w_d = to_device(type, w), b_d = to_device(out_type, b);
          device_buffer y = poisoned(s.tokens * s.out * element_size(out_type));
          mm.run(x_d.get(), w_d.get(), bias ? b_d.get() : nullptr, y.get(), s.tokens, s.in, s.out, type, out_type,
                 nullptr);
          std::vector<double> ref(s.tokens * s.out);
          for (int t = 0; t < s.tokens; ++t) {
            for (int o = 0; o < s.out; ++o) {
              double acc = bias ? b[o] : 0.0;
              for (int i = 0; i < s.in; ++i) acc += static_cast<double>(x[t * s.in + i]) * w[o * s.in + i];
              ref[t * s.out + o] = acc;
            }
          }
          EXPECT_LT(normalized_error(from_device(out_type, y.get(), s.tokens * s.out), ref), tolerance(out_type))
              << dtype_name(type) << "->" << dtype_name(out_type) << " " << s.tokens << "x" << s.in << "->" << s.out
              << " bias " << bias;
        }
      }
    }
  }
}

}  // namespace
}  // namespace troupe::cuda
