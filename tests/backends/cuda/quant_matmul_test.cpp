// Quantized linear layers on the GPU against the reference dequantizer and a double-precision
// product, for every GGUF weight type, activation dtype, token count (1, 3, 8: the GEMV; 64, 300:
// the dequantize-and-cuBLASLt path; each count through both paths) and row length (1, 3 and 9
// blocks). Outputs are NaN-poisoned first, so an element a kernel forgets fails.
//
// Tolerances (normalized error ||y - ref|| / ||ref||): the GEMV multiplies the exact weights in
// f32, so only the f32 sums and the output's rounding to the activation dtype differ from the
// reference: tolerance(type) (1e-5 f32, 2e-3 f16, 1e-2 bf16). The other path rounds each weight
// to the activation dtype before cuBLASLt (relative 2^-9 in bf16, 2^-11 in f16, exact in f32):
// the same bounds hold with room.

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backends/cuda/linear.hpp"
#include "backends/cuda/linear_weight.hpp"
#include "backends/cuda/ops.hpp"
#include "model/weight_values.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

weight_tensor host_tensor(const std::string& name, dtype type, int64_t rows, int64_t cols,
                          const std::vector<std::byte>& bytes) {
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = type;
  tensor.shape = {rows, cols};
  tensor.data = bytes.data();
  tensor.num_bytes = bytes.size();
  return tensor;
}

// The values a tensor stands for (row scales and column order applied), [rows, cols].
std::vector<float> tensor_values(const weight_tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.num_elements()));
  weight_rows_f32(tensor, 0, tensor.rows(), values.data());
  return values;
}

// ref [tokens, rows] = x [tokens, cols] · w [rows, cols]ᵀ (+ bias), in double.
std::vector<double> reference_product(const std::vector<float>& x, const std::vector<float>& w,
                                      const std::vector<float>& bias, int tokens, int rows, int cols) {
  std::vector<double> ref(static_cast<size_t>(tokens) * rows);
  for (int t = 0; t < tokens; ++t) {
    for (int r = 0; r < rows; ++r) {
      double sum = bias.empty() ? 0.0 : bias[r];
      for (int k = 0; k < cols; ++k) sum += static_cast<double>(x[t * cols + k]) * w[static_cast<size_t>(r) * cols + k];
      ref[static_cast<size_t>(t) * rows + r] = sum;
    }
  }
  return ref;
}

// Runs `weight` through `layer` and returns y [tokens, out] as floats.
std::vector<float> run_linear(linear& layer, const linear_weight& weight, dtype activation, const std::vector<float>& x,
                              const std::vector<float>& bias, int tokens) {
  device_buffer x_d = to_device(activation, x);
  device_buffer bias_d = to_device(activation, bias);
  device_buffer y = poisoned(static_cast<size_t>(tokens) * weight.out_features * element_size(activation));
  layer.run(weight, x_d.get(), bias.empty() ? nullptr : bias_d.get(), y.get(), tokens, activation, activation, nullptr);
  return from_device(activation, y.get(), static_cast<size_t>(tokens) * weight.out_features);
}

// Every type the kernels keep: the GGUF block types, and FP8 (E4M3 with a checkpoint's row scales,
// applied in the GEMV's epilogue and by the dequantizer; b128 with its block scales).
TEST(cuda_quant_matmul, gemv_and_dequantized_gemm_match_the_reference_for_every_type) {
  TROUPE_REQUIRE_GPU();
  device_buffer staging;
  for (dtype type : device_weight_types()) {
    const int64_t block = device_block_size(type);
    for (int blocks : {1, 3, 9}) {
      const int rows = 45, cols = static_cast<int>(blocks * block);
      const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 3 * blocks + static_cast<int>(type));
      weight_tensor tensor = host_tensor("w", type, rows, cols, bytes);
      if (type == dtype::fp8_e4m3) tensor.row_scales = random_row_scales(rows, static_cast<uint32_t>(blocks));
      const std::vector<float> w = tensor_values(tensor);
      const linear_weight weight = upload_linear_weight({&tensor}, dtype::f32, staging, nullptr);
      // One layer that always takes the GEMV, one that always dequantizes (scratch for f32, the widest).
      linear gemv_layer(0, 1 << 30);
      linear gemm_layer(dequantize_scratch_bytes(weight, dtype::f32, default_dequantize_scratch_bytes), 0);
      std::mt19937 rng(blocks);
      for (dtype activation : activation_types()) {
        for (int tokens : {1, 3, 8, 64, 300}) {
          const std::vector<float> x = rounded(activation, random_values(static_cast<size_t>(tokens) * cols, rng));
          const std::vector<float> bias =
              tokens == 3 ? rounded(activation, random_values(rows, rng)) : std::vector<float>{};
          const std::vector<double> ref = reference_product(x, w, bias, tokens, rows, cols);
          for (bool gemv : {true, false}) {
            const std::vector<float> y =
                run_linear(gemv ? gemv_layer : gemm_layer, weight, activation, x, bias, tokens);
            EXPECT_LT(normalized_error(y, ref), tolerance(activation))
                << dtype_name(type) << " [" << rows << ", " << cols << "] x " << dtype_name(activation) << ", "
                << tokens << " tokens, " << (gemv ? "GEMV" : "dequantize + cuBLASLt");
          }
        }
      }
    }
  }
}

// A fused weight of parts in different types (as Q4_K_M gives q|k|v), plus a plain part, with a
// bias, through slices of 128 rows that cut across the parts.
TEST(cuda_quant_matmul, mixed_parts_and_slices_match_the_reference) {
  TROUPE_REQUIRE_GPU();
  const int cols = 512;
  struct piece {
    dtype type;
    int rows;
  };
  const std::vector<piece> pieces{{dtype::q4_k, 200}, {dtype::q6_k, 72}, {dtype::f16, 64}, {dtype::q8_0, 40}};
  std::vector<std::vector<std::byte>> bytes;
  std::vector<weight_tensor> tensors;
  std::vector<float> w;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const piece& p = pieces[i];
    std::vector<float> values;
    if (p.type == dtype::f16) {
      std::mt19937 rng(5);
      values = rounded(dtype::f16, random_values(static_cast<size_t>(p.rows) * cols, rng, 0.05f));
      bytes.push_back(encode(dtype::f16, values));
    } else {
      bytes.push_back(random_quantized_rows(p.type, p.rows, cols, 17 + static_cast<uint32_t>(i)));
      values = reference_values(p.type, bytes.back(), int64_t{p.rows} * cols);
    }
    w.insert(w.end(), values.begin(), values.end());
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    tensors.push_back(host_tensor("part" + std::to_string(i), pieces[i].type, pieces[i].rows, cols, bytes[i]));
  }
  const int rows = static_cast<int>(w.size() / cols);
  std::mt19937 rng(9);
  for (dtype activation : activation_types()) {
    device_buffer staging;
    std::vector<const weight_tensor*> parts;
    for (const weight_tensor& t : tensors) parts.push_back(&t);
    const linear_weight weight = upload_linear_weight(parts, activation, staging, nullptr);
    ASSERT_EQ(weight.parts.size(), 4u);
    ASSERT_EQ(weight.out_features, rows);
    const std::vector<float> bias = rounded(activation, random_values(rows, rng));
    // The plain part is stored in the activation dtype: the reference sees it rounded so.
    std::vector<float> w_stored = w;
    for (size_t i = 272 * cols; i < 336 * cols; ++i) w_stored[i] = round_to(activation, w[i]);
    for (int tokens : {1, 5, 40, 300}) {
      const std::vector<float> x = rounded(activation, random_values(static_cast<size_t>(tokens) * cols, rng));
      const std::vector<double> ref = reference_product(x, w_stored, bias, tokens, rows, cols);
      // A scratch of 128 rows: slices [0, 128), [128, 256), [256, 376) across the parts' edges.
      linear layer(dequantize_scratch_bytes(weight, activation, 128 * cols * element_size(activation)),
                   default_gemv_max_tokens);
      device_buffer x_d = to_device(activation, x), bias_d = to_device(activation, bias);
      device_buffer y = poisoned(static_cast<size_t>(tokens) * rows * element_size(activation));
      layer.run(weight, x_d.get(), bias_d.get(), y.get(), tokens, activation, activation, nullptr);
      EXPECT_LT(normalized_error(from_device(activation, y.get(), static_cast<size_t>(tokens) * rows), ref),
                tolerance(activation))
          << dtype_name(activation) << ", " << tokens << " tokens";
    }
  }
}

// Logits: 16-bit activations in, f32 out, through both paths.
TEST(cuda_quant_matmul, sixteen_bit_activations_give_f32_logits) {
  TROUPE_REQUIRE_GPU();
  const int rows = 300, cols = 256;
  const std::vector<std::byte> bytes = random_quantized_rows(dtype::q6_k, rows, cols, 4);
  const std::vector<float> w = reference_values(dtype::q6_k, bytes, int64_t{rows} * cols);
  const weight_tensor tensor = host_tensor("lm_head", dtype::q6_k, rows, cols, bytes);
  device_buffer staging;
  const linear_weight weight = upload_linear_weight({&tensor}, dtype::bf16, staging, nullptr);
  std::mt19937 rng(4);
  for (int tokens : {2, 20}) {
    const std::vector<float> x = rounded(dtype::bf16, random_values(static_cast<size_t>(tokens) * cols, rng));
    linear layer(dequantize_scratch_bytes(weight, dtype::bf16, default_dequantize_scratch_bytes));
    device_buffer x_d = to_device(dtype::bf16, x);
    device_buffer y = poisoned(static_cast<size_t>(tokens) * rows * 4);
    layer.run(weight, x_d.get(), nullptr, y.get(), tokens, dtype::bf16, dtype::f32, nullptr);
    // f32 out: the GEMV (2 tokens) is exact to f32 sums; the bf16 slice (20 tokens) to bf16 weights.
    EXPECT_LT(normalized_error(from_device(dtype::f32, y.get(), static_cast<size_t>(tokens) * rows),
                               reference_product(x, w, {}, tokens, rows, cols)),
              tokens <= default_gemv_max_tokens ? 1e-5 : 1e-2)
        << tokens << " tokens";
  }
}

TEST(cuda_quant_matmul, dequantize_rows_gathers_rows_exactly) {
  TROUPE_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (dtype type : device_weight_types()) {
    const int rows = 37, cols = static_cast<int>(2 * device_block_size(type)), n = 23;
    const std::vector<std::byte> bytes = random_quantized_rows(type, rows, cols, 31);
    const std::vector<float> table = reference_values(type, bytes, int64_t{rows} * cols);
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = std::uniform_int_distribution<int>(0, rows - 1)(rng);
    device_buffer table_d = to_device_raw(bytes), ids_d = to_device_raw(ids);
    for (dtype out_type : activation_types()) {
      device_buffer out = poisoned(static_cast<size_t>(n) * cols * element_size(out_type));
      dequantize_rows(table_d.get(), type, nullptr, cols, ids_d.as<int32_t>(), 0, n, out.get(), cols, out_type,
                      nullptr);
      const std::vector<float> got = from_device(out_type, out.get(), static_cast<size_t>(n) * cols);
      for (int i = 0; i < n; ++i) {
        for (int c = 0; c < cols; ++c) {
          ASSERT_EQ(got[i * cols + c], round_to(out_type, table[ids[i] * cols + c]))
              << dtype_name(type) << " -> " << dtype_name(out_type) << " row " << ids[i] << " column " << c;
        }
      }
      // Without ids: rows first_row .. first_row + n - 1.
      device_buffer slice = poisoned(static_cast<size_t>(5) * cols * element_size(out_type));
      dequantize_rows(table_d.get(), type, nullptr, cols, nullptr, 7, 5, slice.get(), cols, out_type, nullptr);
      const std::vector<float> rows_got = from_device(out_type, slice.get(), static_cast<size_t>(5) * cols);
      for (int c = 0; c < 5 * cols; ++c) ASSERT_EQ(rows_got[c], round_to(out_type, table[7 * cols + c])) << c;
    }
  }
}

// The prefill path's slices (no device needed): multiples of 128 rows within the scratch.
TEST(cuda_quant_matmul, slices_are_whole_128_row_steps_within_the_scratch) {
  EXPECT_EQ(slice_rows(4096, default_dequantize_scratch_bytes, dtype::bf16), 8192);
  EXPECT_EQ(slice_rows(4096, default_dequantize_scratch_bytes, dtype::f32), 4096);
  EXPECT_EQ(slice_rows(1000, 300000, dtype::bf16), 128);  // 150 rows fit
  EXPECT_EQ(slice_rows(1000, 200000, dtype::bf16), 100);  // fewer than 128 fit: all of them
  linear_weight quantized;
  quantized.out_features = 300;
  quantized.in_features = 4096;
  quantized.parts = {linear_part{dtype::q4_k, 0, 300, 0}};
  EXPECT_EQ(dequantize_scratch_bytes(quantized, dtype::bf16, default_dequantize_scratch_bytes), size_t{300} * 4096 * 2);
  // A small cap still leaves 128 rows a slice.
  EXPECT_EQ(dequantize_scratch_bytes(quantized, dtype::bf16, 1024), size_t{128} * 4096 * 2);
  // Every GGUF block type and both FP8 types stay quantized on the device; plain types are
  // converted, and so is a tensor whose columns are in act order.
  for (dtype type : device_weight_types()) EXPECT_TRUE(kept_quantized(type)) << dtype_name(type);
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16}) EXPECT_FALSE(kept_quantized(type));
  weight_tensor act_order;
  act_order.type = dtype::q4_0;
  EXPECT_TRUE(stored_quantized(act_order));
  act_order.input_order = {1, 0};
  EXPECT_FALSE(stored_quantized(act_order));
  // FP8 rows are read 32 values at a time: a narrower multiple is converted, not refused.
  weight_tensor fp8;
  fp8.type = dtype::fp8_e4m3;
  fp8.shape = {4, 64};
  EXPECT_TRUE(stored_quantized(fp8));
  fp8.shape = {4, 48};
  EXPECT_FALSE(stored_quantized(fp8));
  linear_weight plain = quantized;
  plain.parts = {linear_part{dtype::bf16, 0, 300, 0}};
  EXPECT_EQ(dequantize_scratch_bytes(plain, dtype::bf16, default_dequantize_scratch_bytes), 0u);
}

// A quantized checkpoint's layers as the HF loader hands them over: a GPTQ act-order q4_0 tensor
// (its columns permuted: converted on upload, its values by weight_rows_f32), a q8_0 one with row
// scales (kept, scaled per row) and an FP8 one with row scales, fused in one weight, through
// both paths.
TEST(cuda_quant_matmul, row_scales_and_act_order_columns_give_the_tensors_values) {
  TROUPE_REQUIRE_GPU();
  const int cols = 256;
  std::mt19937 rng(12);
  const std::vector<std::byte> q4 = random_quantized_rows(dtype::q4_0, 64, cols, 1);
  const std::vector<std::byte> q8 = random_quantized_rows(dtype::q8_0, 40, cols, 2);
  const std::vector<std::byte> fp8 = random_quantized_rows(dtype::fp8_e4m3, 24, cols, 3);
  weight_tensor act_order = host_tensor("q_proj", dtype::q4_0, 64, cols, q4);
  act_order.input_order.resize(cols);
  std::iota(act_order.input_order.begin(), act_order.input_order.end(), 0);
  std::shuffle(act_order.input_order.begin(), act_order.input_order.end(), rng);
  weight_tensor scaled = host_tensor("k_proj", dtype::q8_0, 40, cols, q8);
  scaled.row_scales = random_row_scales(40, 4, 40.0f);
  weight_tensor fp8_rows = host_tensor("v_proj", dtype::fp8_e4m3, 24, cols, fp8);
  fp8_rows.row_scales = random_row_scales(24, 5);
  std::vector<float> w = tensor_values(act_order);
  for (const weight_tensor* t : {&scaled, &fp8_rows}) {
    const std::vector<float> values = tensor_values(*t);
    w.insert(w.end(), values.begin(), values.end());
  }
  const int rows = 128;
  for (dtype activation : activation_types()) {
    device_buffer staging;
    const linear_weight weight = upload_linear_weight({&act_order, &scaled, &fp8_rows}, activation, staging, nullptr);
    ASSERT_EQ(weight.parts.size(), 3u);
    EXPECT_EQ(weight.parts[0].type, activation) << "act-order columns are converted on upload";
    EXPECT_EQ(weight.parts[1].type, dtype::q8_0);
    EXPECT_EQ(weight.parts[2].type, dtype::fp8_e4m3);
    std::vector<float> w_stored = w;
    for (size_t i = 0; i < size_t{64} * cols; ++i) w_stored[i] = round_to(activation, w[i]);
    linear layer(dequantize_scratch_bytes(weight, activation, default_dequantize_scratch_bytes));
    for (int tokens : {2, 50}) {
      const std::vector<float> x = rounded(activation, random_values(static_cast<size_t>(tokens) * cols, rng));
      device_buffer x_d = to_device(activation, x);
      device_buffer y = poisoned(static_cast<size_t>(tokens) * rows * element_size(activation));
      layer.run(weight, x_d.get(), nullptr, y.get(), tokens, activation, activation, nullptr);
      EXPECT_LT(normalized_error(from_device(activation, y.get(), static_cast<size_t>(tokens) * rows),
                                 reference_product(x, w_stored, {}, tokens, rows, cols)),
                tolerance(activation))
          << dtype_name(activation) << ", " << tokens << " tokens";
    }
  }
}

// Refusals come before any device call: they run without a GPU too.
TEST(cuda_quant_matmul, refuses_misshapen_weights_and_misaligned_activations_naming_them) {
  device_buffer staging;
  const std::vector<std::byte> bytes = random_quantized_rows(dtype::q4_k, 4, 256, 1);
  const weight_tensor not_whole_blocks = host_tensor("model.layers.0.mlp.down_proj.weight", dtype::q4_k, 8, 128, bytes);
  try {
    upload_linear_weight({&not_whole_blocks}, dtype::bf16, staging, nullptr);
    ADD_FAILURE() << "rows of half a block were accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256-value blocks"), std::string::npos) << e.what();
  }
  const weight_tensor lying = host_tensor("model.layers.0.self_attn.q_proj.weight", dtype::q4_k, 4, 512, bytes);
  try {
    upload_linear_weight({&lying}, dtype::bf16, staging, nullptr);
    ADD_FAILURE() << "a tensor with half its bytes was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
  }
  alignas(16) static float x[64];
  EXPECT_THROW(quant_gemv(bytes.data(), dtype::q4_k, nullptr, 4, 256, x + 1, 256, dtype::f32, 1, nullptr, x, 4,
                          dtype::f32, nullptr),
               std::runtime_error);
  EXPECT_THROW(
      quant_gemv(bytes.data(), dtype::q4_k, nullptr, 4, 200, x, 256, dtype::f32, 1, nullptr, x, 4, dtype::f32, nullptr),
      std::runtime_error);
  EXPECT_THROW(
      quant_gemv(bytes.data(), dtype::bf16, nullptr, 4, 256, x, 256, dtype::f32, 1, nullptr, x, 4, dtype::f32, nullptr),
      std::runtime_error);
}

}  // namespace
}  // namespace troupe::cuda
