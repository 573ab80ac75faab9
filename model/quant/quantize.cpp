#include "model/quant/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/half_float.hpp"
#include "model/quant/fp8.hpp"
#include "model/quant/k_quants.hpp"
#include "model/quant/legacy_quants.hpp"
#include "model/quant/nonlinear_quants.hpp"

namespace troupe::quant {

void quantize_row(dtype type, const float* x, int64_t count, std::byte* out, const float* weights) {
  switch (type) {
    case dtype::f32: std::memcpy(out, x, static_cast<size_t>(count) * 4); return;
    case dtype::f16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case dtype::bf16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case dtype::fp8_e4m3:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<std::byte>(f32_to_fp8_e4m3(x[i]));
      return;
    case dtype::q8_0: return quantize_q8_0(x, out, count, weights);
    case dtype::q4_0: return quantize_q4_0(x, out, count, weights);
    case dtype::q4_1: return quantize_q4_1(x, out, count, weights);
    case dtype::q5_0: return quantize_q5_0(x, out, count, weights);
    case dtype::q5_1: return quantize_q5_1(x, out, count, weights);
    case dtype::q2_k: return quantize_q2_k(x, out, count, weights);
    case dtype::q3_k: return quantize_q3_k(x, out, count, weights);
    case dtype::q4_k: return quantize_q4_k(x, out, count, weights);
    case dtype::q5_k: return quantize_q5_k(x, out, count, weights);
    case dtype::q6_k: return quantize_q6_k(x, out, count, weights);
    case dtype::iq4_nl: return quantize_iq4_nl(x, out, count, weights);
    case dtype::iq4_xs: return quantize_iq4_xs(x, out, count, weights);
    case dtype::mxfp4: return quantize_mxfp4(x, out, count, weights);
    case dtype::fp8_e4m3_b128:
      // Each block's scale maps its largest magnitude to E4M3's largest, as the FP8 checkpoint
      // tools scale their blocks.
      for (int64_t b = 0; b < count / fp8_b128_block_size; ++b) {
        const float* v = x + b * fp8_b128_block_size;
        std::byte* block = out + b * fp8_b128_block_bytes;
        float amax = 0.0f;
        for (int64_t j = 0; j < fp8_b128_block_size; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float scale = amax > 0.0f ? amax / fp8_e4m3_max : 1.0f;
        std::memcpy(block, &scale, 4);
        for (int64_t j = 0; j < fp8_b128_block_size; ++j)
          block[4 + j] = static_cast<std::byte>(f32_to_fp8_e4m3(v[j] / scale));
      }
      return;
  }
}

}  // namespace troupe::quant
