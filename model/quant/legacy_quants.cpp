#include "model/quant/legacy_quants.hpp"

#include "model/quant/block_fields.hpp"

namespace troupe::quant {

void dequantize_q4_0(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 18;
    const float d = read_f16(block);
    const uint8_t* qs = bytes_at(block + 2);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q4_1(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 20;
    const float d = read_f16(block);
    const float m = read_f16(block + 2);
    const uint8_t* qs = bytes_at(block + 4);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
      y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

void dequantize_q5_0(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 22;
    const float d = read_f16(block);
    const uint32_t qh = read_u32(block + 2);
    const uint8_t* qs = bytes_at(block + 6);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int low = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
      const int high = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(low - 16);
      y[j + 16] = d * static_cast<float>(high - 16);
    }
  }
}

void dequantize_q5_1(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 24;
    const float d = read_f16(block);
    const float m = read_f16(block + 2);
    const uint32_t qh = read_u32(block + 4);
    const uint8_t* qs = bytes_at(block + 8);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int low = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
      const int high = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(low) + m;
      y[j + 16] = d * static_cast<float>(high) + m;
    }
  }
}

void dequantize_q8_0(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 34;
    const float d = read_f16(block);
    const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(qs[j]);
  }
}

}  // namespace troupe::quant
