#pragma once
// Quantized weights for the CPU backend's tests: random blocks of every quantized type (every
// bit pattern of the codes, finite scales of either sign), and whole weight stores quantized by
// llama.cpp's own library (tests/ggml_oracle.hpp) beside their dequantized f32 twins.

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/half_float.hpp"
#include "model/loader/gguf_types.hpp"
#include "model/model_config.hpp"
#include "model/quant/dequantize.hpp"
#include "model/weight_store.hpp"
#include "tests/ggml_oracle.hpp"

namespace troupe::test {

// Every GGUF block type with CPU integer kernels.
inline const std::vector<dtype>& quantized_types() {
  static const std::vector<dtype> types = {dtype::q4_0,   dtype::q4_1,   dtype::q5_0, dtype::q5_1, dtype::q8_0,
                                           dtype::q2_k,   dtype::q3_k,   dtype::q4_k, dtype::q5_k, dtype::q6_k,
                                           dtype::iq4_nl, dtype::iq4_xs, dtype::mxfp4};
  return types;
}

// Byte offsets of a block's f16 scale fields (the rest of a block is codes and packed integer
// scales, any bit pattern of which is valid).
inline std::vector<size_t> f16_scale_fields(dtype type) {
  switch (type) {
    case dtype::q4_1:
    case dtype::q5_1:
    case dtype::q4_k:
    case dtype::q5_k: return {0, 2};
    case dtype::q2_k: return {80, 82};
    case dtype::q3_k: return {108};
    case dtype::q6_k: return {208};
    case dtype::mxfp4: return {};
    default: return {0};
  }
}

// `rows` rows of `k` elements of `type`: random bytes, with every f16 scale a finite value of
// random sign between 2^-9 and 2^-4 and MXFP4 exponents in 2^-10 .. 2^0.
inline std::vector<std::byte> random_blocks(dtype type, int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t row_size = row_bytes(type, k);
  std::vector<std::byte> bytes(row_size * rows);
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  const size_t block_bytes = dtype_traits_of(type).block_bytes;
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-9, -5);
  for (size_t at = 0; at < bytes.size(); at += block_bytes) {
    for (size_t field : f16_scale_fields(type)) {
      const float scale = std::ldexp(mantissa(rng), exponent(rng)) * (rng() & 1 ? -1.0f : 1.0f);
      const uint16_t bits = f32_to_f16(scale);
      std::memcpy(bytes.data() + at + field, &bits, 2);
    }
    if (type == dtype::mxfp4) bytes[at] = static_cast<std::byte>(117 + rng() % 11);
  }
  return bytes;
}

// The reference dequantizer's values of `rows` rows of `k` elements.
inline std::vector<float> dequantized(dtype type, const std::vector<std::byte>& bytes, int64_t rows, int64_t k) {
  std::vector<float> values(static_cast<size_t>(rows * k));
  quant::dequantize_row(type, bytes.data(), values.data(), rows * k);
  return values;
}

// A small random-weight Llama whose matrices are whole 256-blocks wide (hidden 256, head_dim 64,
// GQA 2), for the k-quants and IQ4_XS: the shape the quantized model tests share.
inline model_config k_quant_llama_config(int intermediate_size, int num_layers, int vocab_size) {
  model_config config;
  config.arch = architecture::llama;
  config.hidden_size = 256;
  config.intermediate_size = intermediate_size;
  config.num_layers = num_layers;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.vocab_size = vocab_size;
  config.max_position_embeddings = 256;
  return config;
}

// A quantized weight store and the same weights dequantized to f32: every matrix whose rows are
// whole blocks of `type` is quantized by ggml (the rest, norms and odd-width matrices, stays
// f32 in both, as llama.cpp's quantizer keeps them in a higher type).
struct quantized_pair {
  weight_store quantized;
  weight_store dequantized;
  int num_quantized = 0;
};

// The tensors left unquantized point into f32_weights, which must outlive the pair.
inline quantized_pair quantize_store(const weight_store& f32_weights, dtype type) {
  const auto& oracle = testing::ggml_oracle::instance();
  quantized_pair pair;
  for (const auto& [name, tensor] : f32_weights.tensors()) {
    const int64_t cols = tensor.shape.back();
    const bool quantize = tensor.type == dtype::f32 && tensor.shape.size() == 2 && cols % dtype_block_size(type) == 0;
    if (!quantize) {
      pair.quantized.add(tensor);
      pair.dequantized.add(tensor);
      continue;
    }
    const int64_t rows = tensor.shape[0];
    auto blocks = std::make_shared<std::vector<std::byte>>(oracle.quantize(static_cast<uint32_t>(gguf_type_of(type)),
                                                                           reinterpret_cast<const float*>(tensor.data),
                                                                           rows, cols, row_bytes(type, cols)));
    auto values = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(rows * cols) * 4);
    quant::dequantize_row(type, blocks->data(), reinterpret_cast<float*>(values->data()), rows * cols);
    weight_tensor q = tensor;
    q.type = type;
    q.data = blocks->data();
    q.num_bytes = blocks->size();
    weight_tensor f = tensor;
    f.data = values->data();
    f.num_bytes = values->size();
    pair.quantized.keep_alive(blocks);
    pair.dequantized.keep_alive(values);
    pair.quantized.add(std::move(q));
    pair.dequantized.add(std::move(f));
    ++pair.num_quantized;
  }
  return pair;
}

}  // namespace troupe::test
