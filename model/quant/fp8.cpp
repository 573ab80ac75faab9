#include "model/quant/fp8.hpp"

#include <cmath>
#include <cstring>

namespace troupe::quant {

float fp8_e4m3_to_f32(uint8_t bits) {
  const bool negative = (bits & 0x80) != 0;
  const int exponent = (bits >> 3) & 0x0f;
  const int mantissa = bits & 0x07;
  float magnitude;
  if (exponent == 0x0f && mantissa == 0x07) {
    magnitude = std::nanf("");
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m / 8 * 2^-6
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t f32_to_fp8_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  float magnitude = std::fabs(value);
  if (magnitude >= fp8_e4m3_max) return sign | 0x7e;  // 448
  if (magnitude < std::ldexp(1.0f, -6)) {
    // Subnormals are multiples of 2^-9: round the count of them to nearest even.
    const float steps = std::nearbyint(magnitude * 512.0f);  // default rounding: to nearest even
    return sign | static_cast<uint8_t>(steps);               // steps == 8 is the smallest normal, 0x08: correct
  }
  int exponent;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent, fraction in [0.5, 1)
  // magnitude = (1 + m/8) * 2^(exponent - 1): round 16 * fraction - 8 (in [0, 8)) to nearest even.
  float mantissa = std::nearbyint(fraction * 16.0f - 8.0f);
  int biased = exponent - 1 + 7;
  if (mantissa >= 8.0f) {
    mantissa = 0.0f;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mantissa > 6.0f)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | static_cast<int>(mantissa));
}

void dequantize_fp8_e4m3(const std::byte* data, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(data[i]));
}

void dequantize_fp8_e4m3_b128(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / fp8_b128_block_size; ++b) {
    const std::byte* block = blocks + b * fp8_b128_block_bytes;
    float scale;
    std::memcpy(&scale, block, 4);
    for (int64_t j = 0; j < fp8_b128_block_size; ++j) {
      out[b * fp8_b128_block_size + j] = scale * fp8_e4m3_to_f32(static_cast<uint8_t>(block[4 + j]));
    }
  }
}

}  // namespace troupe::quant
