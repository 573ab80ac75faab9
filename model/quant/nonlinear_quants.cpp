#include "model/quant/nonlinear_quants.hpp"

#include "model/quant/block_fields.hpp"

namespace troupe::quant {

void dequantize_iq4_nl(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 18;
    const float d = read_f16(block);
    const uint8_t* qs = bytes_at(block + 2);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(iq4_levels[qs[j] & 0x0f]);
      y[j + 16] = d * static_cast<float>(iq4_levels[qs[j] >> 4]);
    }
  }
}

int iq4_xs_scale(const std::byte* block, int sub_block) { return iq4_xs_sub_scale(block, sub_block); }

void dequantize_iq4_xs(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 256; ++b) {
    const std::byte* block = blocks + b * 136;
    const float d = read_f16(block);
    const uint8_t* qs = bytes_at(block + 8);
    float* y = out + b * 256;
    for (int sub = 0; sub < 8; ++sub) {
      const float dl = d * static_cast<float>(iq4_xs_scale(block, sub));
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(iq4_levels[qs[j] & 0x0f]);
        y[j + 16] = dl * static_cast<float>(iq4_levels[qs[j] >> 4]);
      }
      y += 32;
      qs += 16;
    }
  }
}

void dequantize_mxfp4(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const std::byte* block = blocks + b * 17;
    const float d = e8m0_half(bytes_at(block)[0]);
    const uint8_t* qs = bytes_at(block + 1);
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(mxfp4_doubled_levels[qs[j] & 0x0f]) * d;
      y[j + 16] = static_cast<float>(mxfp4_doubled_levels[qs[j] >> 4]) * d;
    }
  }
}

}  // namespace troupe::quant
