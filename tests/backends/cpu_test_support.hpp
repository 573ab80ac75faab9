#pragma once
// Helpers shared by the CPU backend tests: random tensors in every weight dtype, the SIMD
// levels this machine can run, and a naive dequantizer to build references from.

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/simd_level.hpp"
#include "model/dtype.hpp"
#include "model/half_float.hpp"
#include "model/weight_store.hpp"

namespace troupe::test {

inline std::vector<cpu::simd_level> supported_simd_levels() {
  std::vector<cpu::simd_level> levels;
  for (auto level :
       {cpu::simd_level::scalar, cpu::simd_level::avx2, cpu::simd_level::avx512, cpu::simd_level::avx512_vnni})
    if (cpu::simd_level_supported(level)) levels.push_back(level);
  return levels;
}

// Forces a SIMD level for one scope.
class scoped_simd_level {
 public:
  explicit scoped_simd_level(cpu::simd_level level) { cpu::force_simd_level(level); }
  ~scoped_simd_level() { cpu::clear_forced_simd_level(); }
};

inline std::vector<float> random_floats(size_t count, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// Encodes f32 values in `type` (Q8_0 as GGUF does: scale = max|x| / 127 per 32 values).
inline std::vector<std::byte> encode(const std::vector<float>& values, dtype type) {
  std::vector<std::byte> bytes;
  if (type == dtype::f32) {
    bytes.resize(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (type == dtype::f16 || type == dtype::bf16) {
    bytes.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits = type == dtype::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  } else {
    const size_t num_blocks = values.size() / q8_0_block_size;
    bytes.resize(num_blocks * q8_0_block_bytes);
    for (size_t b = 0; b < num_blocks; ++b) {
      float max_abs = 0.0f;
      for (int i = 0; i < q8_0_block_size; ++i) max_abs = std::max(max_abs, std::fabs(values[b * 32 + i]));
      const float scale = max_abs / 127.0f;
      const uint16_t scale_bits = f32_to_f16(scale);
      std::memcpy(bytes.data() + b * q8_0_block_bytes, &scale_bits, 2);
      for (int i = 0; i < q8_0_block_size; ++i) {
        const float q = scale == 0.0f ? 0.0f : std::round(values[b * 32 + i] / scale);
        const int8_t qi = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, q)));
        std::memcpy(bytes.data() + b * q8_0_block_bytes + 2 + i, &qi, 1);
      }
    }
  }
  return bytes;
}

// The values a kernel should see for `bytes` of `type`, decoded one element at a time.
inline std::vector<double> decode_naive(const std::vector<std::byte>& bytes, dtype type, size_t count) {
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits;
    switch (type) {
      case dtype::f32: {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        values[i] = f;
        break;
      }
      case dtype::f16:
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        values[i] = f16_to_f32(bits);
        break;
      case dtype::bf16:
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        values[i] = bf16_to_f32(bits);
        break;
      case dtype::q8_0: {
        const size_t block = i / 32;
        std::memcpy(&bits, bytes.data() + block * q8_0_block_bytes, 2);
        int8_t q;
        std::memcpy(&q, bytes.data() + block * q8_0_block_bytes + 2 + i % 32, 1);
        values[i] = static_cast<double>(f16_to_f32(bits)) * q;
        break;
      }
      default: throw std::invalid_argument("decode_naive: no naive decoder for " + std::string(dtype_name(type)));
    }
  }
  return values;
}

// Adds `values` encoded in `type` as tensor `name` of `shape`, the buffer owned by the store.
inline void add_tensor(weight_store& store, const std::string& name, std::vector<int64_t> shape,
                       const std::vector<float>& values, dtype type) {
  auto bytes = std::make_shared<std::vector<std::byte>>(encode(values, type));
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = type;
  tensor.shape = std::move(shape);
  tensor.data = bytes->data();
  tensor.num_bytes = bytes->size();
  store.keep_alive(bytes);
  store.add(std::move(tensor));
}

}  // namespace troupe::test
