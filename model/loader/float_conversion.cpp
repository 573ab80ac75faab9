#include "model/loader/float_conversion.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/quant/dequantize.hpp"

namespace troupe {

void quantize_q8_0(std::span<const float> values, std::byte* out) {
  if (values.size() % q8_0_block_size != 0) {
    throw std::runtime_error("Q8_0 needs a multiple of 32 values, got " + std::to_string(values.size()));
  }
  for (size_t block = 0; block < values.size() / q8_0_block_size; ++block) {
    const float* x = values.data() + block * q8_0_block_size;
    std::byte* dst = out + block * q8_0_block_bytes;
    float max_abs = 0.0f;
    for (int i = 0; i < q8_0_block_size; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    float d = max_abs / 127.0f;
    float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t scale = f32_to_f16(d);
    std::memcpy(dst, &scale, 2);
    for (int i = 0; i < q8_0_block_size; ++i) {
      auto q = static_cast<int8_t>(std::lround(std::clamp(x[i] * inverse, -127.0f, 127.0f)));
      std::memcpy(dst + 2 + i, &q, 1);
    }
  }
}

void convert_from_f32(std::span<const float> values, dtype type, std::byte* out) {
  switch (type) {
    case dtype::f32:
      std::memcpy(out, values.data(), values.size() * 4);
      return;
    case dtype::f16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = f32_to_f16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case dtype::bf16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = f32_to_bf16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case dtype::q8_0:
      quantize_q8_0(values, out);
      return;
    default:
      throw std::runtime_error("quantizing to " + std::string(dtype_name(type)) + " is not supported here");
  }
}

void convert_to_f32(const std::byte* data, dtype type, std::span<float> out) {
  quant::dequantize_row(type, data, out.data(), static_cast<int64_t>(out.size()));
}

}  // namespace troupe
