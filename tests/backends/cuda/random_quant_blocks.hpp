#pragma once
// Quantized weights for the CUDA tests: rows of blocks whose every quant bit is random (so every
// code, nibble and high bit of a layout is exercised) and whose scale fields are finite, of a
// chosen magnitude. Not what a quantizer would write, but a valid tensor of the type: the GPU
// and the reference dequantizer must read the very same values from it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "model/dtype.hpp"
#include "model/half_float.hpp"
#include "model/quant/dequantize.hpp"

namespace troupe::cuda::testing {

// Every GGUF weight type the CUDA kernels decode.
inline const std::vector<dtype>& quantized_weight_types() {
  static const std::vector<dtype> types{dtype::q4_0,   dtype::q4_1,   dtype::q5_0, dtype::q5_1, dtype::q8_0,
                                        dtype::q2_k,   dtype::q3_k,   dtype::q4_k, dtype::q5_k, dtype::q6_k,
                                        dtype::iq4_nl, dtype::iq4_xs, dtype::mxfp4};
  return types;
}

// Every type the CUDA kernels keep as stored: the GGUF ones and the FP8 checkpoints' two.
inline const std::vector<dtype>& device_weight_types() {
  static const std::vector<dtype> types = [] {
    std::vector<dtype> all = quantized_weight_types();
    all.push_back(dtype::fp8_e4m3);
    all.push_back(dtype::fp8_e4m3_b128);
    return all;
  }();
  return types;
}

// Elements a row must be a whole number of, for the CUDA kernels (FP8 E4M3 is read 32 at a time).
inline int64_t device_block_size(dtype type) { return std::max<int64_t>(dtype_block_size(type), 32); }

// Host bytes aligned as cudaMalloc aligns device memory (256), so alignment assumptions made for
// the device hold, and are checked, on the host.
struct aligned_bytes {
  explicit aligned_bytes(size_t size)
      : size(size),
        data(static_cast<std::byte*>(std::aligned_alloc(256, (size + 255) / 256 * 256 + 256)), &std::free) {}
  std::byte* get() const { return data.get(); }
  size_t size;
  std::unique_ptr<std::byte, void (*)(void*)> data;
};

// The largest magnitude of a block's quant codes times its sub-block scales: how far `d` (the
// block's f16 scale) is multiplied up, so scale fields can be chosen for a target weight size.
inline float code_range(dtype type) {
  switch (type) {
    case dtype::q4_0: return 8.0f;
    case dtype::q4_1: return 15.0f;
    case dtype::q5_0: return 16.0f;
    case dtype::q5_1: return 31.0f;
    case dtype::q8_0: return 127.0f;
    case dtype::q2_k: return 45.0f;
    case dtype::q3_k: return 128.0f;
    case dtype::q4_k: return 945.0f;
    case dtype::q5_k: return 1953.0f;
    case dtype::q6_k: return 4096.0f;
    case dtype::iq4_nl: return 127.0f;
    case dtype::iq4_xs: return 4064.0f;
    case dtype::fp8_e4m3:
    case dtype::fp8_e4m3_b128: return 448.0f;
    default: return 1.0f;
  }
}

// `rows` rows of `cols` values of `type` (cols a multiple of its block size), weights of roughly
// `magnitude` at most (FP8 E4M3, which has no scale in its bytes: codes up to 448; pair it with
// random_row_scales). FP8 codes are never NaN.
inline std::vector<std::byte> random_quantized_rows(dtype type, int64_t rows, int64_t cols, uint32_t seed,
                                                    float magnitude = 0.1f) {
  const dtype_traits& traits = dtype_traits_of(type);
  const int64_t num_blocks = rows * cols / traits.block_size;
  std::vector<std::byte> bytes(static_cast<size_t>(num_blocks) * traits.block_bytes);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
  for (std::byte& b : bytes) b = static_cast<std::byte>(byte(rng));
  auto put_f16 = [&](std::byte* p, float value) {
    const uint16_t h = f32_to_f16(value);
    std::memcpy(p, &h, 2);
  };
  const float d_size = magnitude / code_range(type);
  if (type == dtype::fp8_e4m3 || type == dtype::fp8_e4m3_b128) {
    for (std::byte& b : bytes) {
      if ((static_cast<uint8_t>(b) & 0x7f) == 0x7f)
        b = static_cast<std::byte>(static_cast<uint8_t>(b) - 1);  // NaN -> 448
    }
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    std::byte* block = bytes.data() + b * traits.block_bytes;
    const float d = d_size * uniform(rng) * (byte(rng) < 32 ? -1.0f : 1.0f);  // a few negative scales
    const float min = magnitude * 0.5f * uniform(rng);
    switch (type) {
      case dtype::q4_0:
      case dtype::q5_0:
      case dtype::q8_0:
      case dtype::iq4_nl:
      case dtype::iq4_xs: put_f16(block, d); break;
      case dtype::q4_1:
      case dtype::q5_1:
        put_f16(block, d);
        put_f16(block + 2, -min);
        break;
      case dtype::q4_k:
      case dtype::q5_k:
        put_f16(block, d);
        put_f16(block + 2, min / 63.0f);
        break;
      case dtype::q2_k:
        put_f16(block + 80, d);
        put_f16(block + 82, min / 15.0f);
        break;
      case dtype::q3_k: put_f16(block + 108, d); break;
      case dtype::q6_k: put_f16(block + 208, d); break;
      case dtype::mxfp4: {
        // 2^(e - 128) * 12 near `magnitude`; now and then a tiny exponent (e = 0, 1: subnormal halves).
        const int e = 128 + static_cast<int>(std::floor(std::log2(magnitude / 12.0f))) - byte(rng) % 3;
        block[0] = static_cast<std::byte>(b % 97 == 5 ? b % 2 : e);
        break;
      }
      case dtype::fp8_e4m3_b128: {
        const float scale = d_size * uniform(rng);
        std::memcpy(block, &scale, 4);
        break;
      }
      default: break;
    }
  }
  return bytes;
}

// Scales of `rows` rows that bring FP8 codes (up to 448) to about `magnitude`.
inline std::vector<float> random_row_scales(int64_t rows, uint32_t seed, float magnitude = 0.1f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
  std::vector<float> scales(static_cast<size_t>(rows));
  for (float& s : scales) s = magnitude / 448.0f * uniform(rng);
  return scales;
}

// The reference values of such rows, [rows, cols] f32.
inline std::vector<float> reference_values(dtype type, const std::vector<std::byte>& bytes, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  quant::dequantize_row(type, bytes.data(), values.data(), count);
  return values;
}

}  // namespace troupe::cuda::testing
