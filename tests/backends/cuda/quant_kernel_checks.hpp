#pragma once
// The quantized kernels' per-thread code checked on the host, for every type: included by
// quant_kernels_host_test.cpp (the host branches, with their alignment checks) and by
// quant_device_branches_test.cpp (the device branches, TROUPE_EMULATE_DEVICE), each of which
// includes the kernel headers first. Internal linkage: each file gets the checks of its branch.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "model/quant/fp8.hpp"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

// Each part of each block of every type decodes bit for bit to the reference dequantizer's
// values, the parts of a block cover its elements once, and (host branch) every load keeps the
// alignment it promises.
void expect_parts_decode_to_the_reference_values() {
  for (dtype type : device_weight_types()) {
    const bool known = quant_blocks::visit(type, [&](auto decoder) {
      using block = decltype(decoder);
      EXPECT_EQ(block::type, type);
      EXPECT_EQ(block::size % dtype_block_size(type), 0) << dtype_name(type);
      EXPECT_EQ(block::size, device_block_size(type)) << dtype_name(type);
      EXPECT_EQ(static_cast<size_t>(block::bytes), row_bytes(type, block::size)) << dtype_name(type);
      EXPECT_EQ(block::parts * block::runs * 8, block::size) << dtype_name(type);
      EXPECT_EQ(32 % block::parts, 0) << dtype_name(type) << ": a warp shares whole blocks";
      // Three rows of five blocks, laid out as on the device (rows back to back from an aligned start).
      const int64_t rows = 3, cols = 5 * block::size;
      const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 11 + static_cast<int>(type));
      aligned_bytes device_like(bytes.size());
      std::memcpy(device_like.get(), bytes.data(), bytes.size());
      const std::vector<float> reference = reference_values(type, bytes, rows * cols);
      std::vector<int> seen(reference.size(), 0);
      for (int64_t b = 0; b < rows * cols / block::size; ++b) {
        for (int part = 0; part < block::parts; ++part) {
          float out[block::runs * 8];
          quant_blocks::decode_values<block>(device_like.get() + b * block::bytes, part, out);
          for (int run = 0; run < block::runs; ++run) {
            const int start = block::run_start(part, run);
            ASSERT_EQ(start % 8, 0) << dtype_name(type) << ": a run starts on a multiple of 8";
            for (int j = 0; j < 8; ++j) {
              const size_t element = static_cast<size_t>(b * block::size + start + j);
              ASSERT_LT(element, reference.size());
              ++seen[element];
              uint32_t got, want;
              std::memcpy(&got, &out[run * 8 + j], 4);
              std::memcpy(&want, &reference[element], 4);
              ASSERT_EQ(got, want) << dtype_name(type) << " block " << b << " part " << part << " run " << run
                                   << " element " << element % block::size << ": " << out[run * 8 + j] << ", reference "
                                   << reference[element];
            }
          }
        }
      }
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << dtype_name(type) << " element " << i;
    });
    EXPECT_TRUE(known) << dtype_name(type);
  }
  EXPECT_FALSE(quant_blocks::visit(dtype::bf16, [](auto) {}));
  EXPECT_FALSE(quant_blocks::visit(dtype::f32, [](auto) {}));
}

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

// quant_gemv's per-thread body, summed over the threads of each CTA, against a double product:
// every type, activation dtype, 1 to 11 tokens, rows past the matrix, more blocks than a pass.
void expect_gemv_ctas_to_sum_to_the_reference_product() {
  for (dtype type : device_weight_types()) {
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
    std::vector<float> reference = reference_values(type, bytes, int64_t{rows} * cols);
    // Row 1 without a scale (1), the others with one: value * scale, as weight_rows_f32 computes it.
    std::vector<float> scales = random_row_scales(rows, 5, 448.0f);
    scales[1] = 1.0f;
    for (size_t i = 0; i < reference.size(); ++i) reference[i] *= scales[i / cols];
    aligned_bytes out(static_cast<size_t>(rows) * cols * sizeof(Out));
    std::memset(out.get(), 0xff, out.size);
    const int64_t row_bytes = cols / Block::size * Block::bytes;
    for (int r = 0; r < rows; ++r) {
      for (int item = 0; item < cols / Block::size * Block::parts; ++item) {
        dequantize_item<Block>(table.get() + r * row_bytes, item, scales[r],
                               reinterpret_cast<Out*>(out.get()) + r * cols);
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

// dequantize_rows' items write every element, the reference value (times its row's scale)
// rounded once to the output.
void expect_dequantize_items_to_write_the_reference_values() {
  for (dtype type : device_weight_types()) {
    check_dequantize_for<float>(type);
    check_dequantize_for<__half>(type);
    check_dequantize_for<__nv_bfloat16>(type);
  }
}

// All 256 FP8 E4M3 codes, NaNs and subnormals included, decode as fp8_e4m3_to_f32 does, bit
// for bit (the random blocks above never hold a NaN code).
void expect_every_fp8_code_to_decode_exactly() {
  aligned_bytes codes(256);
  for (int i = 0; i < 256; ++i) codes.get()[i] = static_cast<std::byte>(i);
  for (int b = 0; b < 8; ++b) {
    for (int part = 0; part < 2; ++part) {
      float out[16];
      quant_blocks::decode_values<quant_blocks::fp8_e4m3_block>(codes.get() + 32 * b, part, out);
      for (int i = 0; i < 16; ++i) {
        const int code = 32 * b + 16 * part + i;
        const float want = quant::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
        uint32_t got_bits, want_bits;
        std::memcpy(&got_bits, &out[i], 4);
        std::memcpy(&want_bits, &want, 4);
        ASSERT_EQ(got_bits, want_bits) << "code " << code << ": " << out[i] << ", reference " << want;
      }
    }
  }
}

}  // namespace
}  // namespace troupe::cuda
