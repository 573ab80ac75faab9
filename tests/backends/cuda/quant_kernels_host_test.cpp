// The quantized kernels' per-thread bodies run on the host, thread by thread, as a CTA would run
// them: quant_gemv's gemv_partial summed over the 128 threads of each CTA (rows past the matrix,
// tokens past the batch, blocks beyond one pass of the CTA), and dequantize_rows' items. No GPU
// needed: what a device run adds is the warp reduction, the launch and the intrinsics' bits
// (tests/backends/cuda/quant_matmul_test.cpp checks those where a GPU answers).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cuda/dequantize_rows.cuh"
#include "backends/cuda/quant_gemv.cuh"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

// Activations stored as In, and their values as the kernel reads them.
template <typename In>
struct host_activations {
  host_activations(int tokens, int cols, std::mt19937& rng) : bytes(static_cast<size_t>(tokens) * cols * sizeof(In)) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    values.resize(static_cast<size_t>(tokens) * cols);
    for (size_t i = 0; i < values.size(); ++i) {
      const float v = normal(rng);
      if constexpr (std::is_same_v<In, float>) {
        std::memcpy(bytes.get() + 4 * i, &v, 4);
        values[i] = v;
      } else {
        const uint16_t bits = std::is_same_v<In, __half> ? f32_to_f16(v) : f32_to_bf16(v);
        std::memcpy(bytes.get() + 2 * i, &bits, 2);
        values[i] = std::is_same_v<In, __half> ? f16_to_f32(bits) : bf16_to_f32(bits);
      }
    }
  }
  const In* data() const { return reinterpret_cast<const In*>(bytes.get()); }
  aligned_bytes bytes;
  std::vector<float> values;  // [tokens, cols]
};

// y [tokens, rows] as the GEMV kernel computes it, CTA by CTA, thread by thread.
template <class Block, int Tokens, typename In>
std::vector<double> emulate_gemv(const std::byte* weight, int rows, int cols, const In* x, int tokens) {
  constexpr int Rows = gemv_rows_per_cta, threads = gemv_warps * 32;
  const int64_t row_bytes = cols / Block::size * Block::bytes;
  std::vector<double> y(static_cast<size_t>(tokens) * rows, NAN);
  for (int row0 = 0; row0 < rows; row0 += Rows) {
    for (int token0 = 0; token0 < tokens; token0 += Tokens) {
      const int valid_rows = std::min(Rows, rows - row0), valid_tokens = std::min(Tokens, tokens - token0);
      double sums[Rows][Tokens] = {};
      for (int worker = 0; worker < threads; ++worker) {
        float acc[Rows][Tokens] = {};
        gemv_partial<Block, Rows, Tokens, In>(weight + row0 * row_bytes, row_bytes, valid_rows, cols / Block::size,
                                              x + static_cast<int64_t>(token0) * cols, cols, valid_tokens, worker,
                                              threads, acc);
        for (int r = 0; r < Rows; ++r) {
          for (int t = 0; t < Tokens; ++t) sums[r][t] += acc[r][t];
        }
      }
      for (int r = 0; r < valid_rows; ++r) {
        for (int t = 0; t < valid_tokens; ++t) y[static_cast<size_t>(token0 + t) * rows + row0 + r] = sums[r][t];
      }
    }
  }
  return y;
}

template <typename In>
void check_gemv_for(dtype type, const char* in_name) {
  quant_blocks::visit(type, [&](auto decoder) {
    using Block = decltype(decoder);
    // Enough blocks that a CTA's 128 threads make more than one pass over a row.
    const int passes_blocks = gemv_warps * 32 / Block::parts;
    for (int num_blocks : {1, 3, passes_blocks + 3}) {
      const int rows = 5, cols = num_blocks * Block::size;
      const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 7 * num_blocks + 1);
      aligned_bytes weight(bytes.size());
      std::memcpy(weight.get(), bytes.data(), bytes.size());
      const std::vector<float> w = reference_values(type, bytes, int64_t{rows} * cols);
      std::mt19937 rng(num_blocks);
      for (int tokens : {1, 3, 8, 11}) {
        host_activations<In> x(tokens, cols, rng);
        const std::vector<double> y = tokens == 1
                                          ? emulate_gemv<Block, 1, In>(weight.get(), rows, cols, x.data(), tokens)
                                          : emulate_gemv<Block, 8, In>(weight.get(), rows, cols, x.data(), tokens);
        for (int t = 0; t < tokens; ++t) {
          for (int r = 0; r < rows; ++r) {
            double want = 0, size = 0;
            for (int k = 0; k < cols; ++k) {
              want += static_cast<double>(w[r * cols + k]) * x.values[t * cols + k];
              size += std::fabs(static_cast<double>(w[r * cols + k]) * x.values[t * cols + k]);
            }
            const double got = y[t * rows + r];
            ASSERT_NEAR(got, want, 1e-5 * size + 1e-30)
                << dtype_name(type) << " x " << in_name << ": " << num_blocks << " blocks, " << tokens
                << " tokens, row " << r << " token " << t;
          }
        }
      }
    }
  });
}

TEST(cuda_quant_kernels_on_host, gemv_threads_of_each_cta_sum_to_the_reference_product) {
  for (dtype type : quantized_weight_types()) {
    check_gemv_for<float>(type, "f32");
    check_gemv_for<__half>(type, "f16");
    check_gemv_for<__nv_bfloat16>(type, "bf16");
  }
}

template <typename Out>
void check_dequantize_for(dtype type) {
  quant_blocks::visit(type, [&](auto decoder) {
    using Block = decltype(decoder);
    const int rows = 3, cols = 3 * Block::size;
    const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 99);
    aligned_bytes table(bytes.size());
    std::memcpy(table.get(), bytes.data(), bytes.size());
    const std::vector<float> reference = reference_values(type, bytes, int64_t{rows} * cols);
    aligned_bytes out(static_cast<size_t>(rows) * cols * sizeof(Out));
    std::memset(out.get(), 0xff, out.size);
    const int64_t row_bytes = cols / Block::size * Block::bytes;
    for (int r = 0; r < rows; ++r) {
      for (int item = 0; item < cols / Block::size * Block::parts; ++item) {
        dequantize_item<Block>(table.get() + r * row_bytes, item, reinterpret_cast<Out*>(out.get()) + r * cols);
      }
    }
    for (size_t i = 0; i < reference.size(); ++i) {
      if constexpr (std::is_same_v<Out, float>) {
        float got;
        std::memcpy(&got, out.get() + 4 * i, 4);
        ASSERT_EQ(got, reference[i]) << dtype_name(type) << " element " << i;
      } else {
        uint16_t got;
        std::memcpy(&got, out.get() + 2 * i, 2);
        const uint16_t want = std::is_same_v<Out, __half> ? f32_to_f16(reference[i]) : f32_to_bf16(reference[i]);
        ASSERT_EQ(got, want) << dtype_name(type) << " element " << i;
      }
    }
  });
}

TEST(cuda_quant_kernels_on_host, dequantize_items_write_every_element_rounded_once) {
  for (dtype type : quantized_weight_types()) {
    check_dequantize_for<float>(type);
    check_dequantize_for<__half>(type);
    check_dequantize_for<__nv_bfloat16>(type);
  }
}

}  // namespace
}  // namespace troupe::cuda
