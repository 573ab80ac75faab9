#include "model/quant/dequantize.hpp"

#include <cmath>
#include <cstring>

#include "model/half_float.hpp"
#include "model/quant/block_fields.hpp"
#include "model/quant/fp8.hpp"
#include "model/quant/k_quants.hpp"
#include "model/quant/legacy_quants.hpp"
#include "model/quant/nonlinear_quants.hpp"

namespace troupe::quant {

void dequantize_row(dtype type, const std::byte* data, float* out, int64_t count) {
  switch (type) {
    case dtype::f32: std::memcpy(out, data, static_cast<size_t>(count) * 4); return;
    case dtype::f16:
      for (int64_t i = 0; i < count; ++i) out[i] = f16_to_f32(read_u16(data + 2 * i));
      return;
    case dtype::bf16:
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(read_u16(data + 2 * i));
      return;
    case dtype::q8_0: return dequantize_q8_0(data, out, count);
    case dtype::q4_0: return dequantize_q4_0(data, out, count);
    case dtype::q4_1: return dequantize_q4_1(data, out, count);
    case dtype::q5_0: return dequantize_q5_0(data, out, count);
    case dtype::q5_1: return dequantize_q5_1(data, out, count);
    case dtype::q2_k: return dequantize_q2_k(data, out, count);
    case dtype::q3_k: return dequantize_q3_k(data, out, count);
    case dtype::q4_k: return dequantize_q4_k(data, out, count);
    case dtype::q5_k: return dequantize_q5_k(data, out, count);
    case dtype::q6_k: return dequantize_q6_k(data, out, count);
    case dtype::iq4_nl: return dequantize_iq4_nl(data, out, count);
    case dtype::iq4_xs: return dequantize_iq4_xs(data, out, count);
    case dtype::mxfp4: return dequantize_mxfp4(data, out, count);
    case dtype::fp8_e4m3: return dequantize_fp8_e4m3(data, out, count);
    case dtype::fp8_e4m3_b128: return dequantize_fp8_e4m3_b128(data, out, count);
  }
}

namespace {

// Byte offsets of a block's f16 scale fields, per type ({-1, -1}: none of that kind).
struct scale_fields {
  int first = -1;
  int second = -1;
};

scale_fields f16_scales_of(dtype type) {
  switch (type) {
    case dtype::q8_0:
    case dtype::q4_0:
    case dtype::q5_0:
    case dtype::iq4_nl:
    case dtype::iq4_xs: return {0, -1};
    case dtype::q4_1:
    case dtype::q5_1:
    case dtype::q4_k:
    case dtype::q5_k: return {0, 2};
    case dtype::q2_k: return {80, 82};
    case dtype::q3_k: return {108, -1};
    case dtype::q6_k: return {208, -1};
    default: return {};
  }
}

bool finite_f16(const std::byte* p) { return (read_u16(p) & 0x7c00) != 0x7c00; }

}  // namespace

std::optional<int64_t> first_bad_scale_block(dtype type, const std::byte* data, int64_t count) {
  const dtype_traits& traits = dtype_traits_of(type);
  if (!traits.quantized) return std::nullopt;
  const int64_t num_blocks = count / traits.block_size;
  if (type == dtype::fp8_e4m3_b128) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      if ((read_u32(data + b * traits.block_bytes) & 0x7f800000u) == 0x7f800000u) return b;  // f32 NaN or inf
    }
    return std::nullopt;
  }
  if (type == dtype::mxfp4) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      if (bytes_at(data + b * traits.block_bytes)[0] == 0xff) return b;  // E8M0 NaN
    }
    return std::nullopt;
  }
  const scale_fields fields = f16_scales_of(type);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = data + b * traits.block_bytes;
    if (fields.first >= 0 && !finite_f16(block + fields.first)) return b;
    if (fields.second >= 0 && !finite_f16(block + fields.second)) return b;
  }
  return std::nullopt;
}

}  // namespace troupe::quant
