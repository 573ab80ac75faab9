#include "backends/cuda/linear.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

namespace {

size_t element_bytes(dtype type) { return type == dtype::f32 ? 4 : 2; }

}  // namespace

int slice_rows(int in_features, size_t scratch_bytes, dtype activation) {
  const size_t row = static_cast<size_t>(in_features) * element_bytes(activation);
  const size_t rows = row == 0 ? 0 : scratch_bytes / row;
  return static_cast<int>(std::min<size_t>(rows >= 128 ? rows / 128 * 128 : rows, size_t{1} << 30));
}

size_t dequantize_scratch_bytes(const linear_weight& weight, dtype activation, size_t cap) {
  if (!weight.quantized()) return 0;
  const size_t row = static_cast<size_t>(weight.in_features) * element_bytes(activation);
  // At least 128 rows a slice, even past the cap: fewer would leave cuBLASLt a sliver to multiply.
  const int rows = std::min(weight.out_features, std::max(128, slice_rows(weight.in_features, cap, activation)));
  return static_cast<size_t>(rows) * row;
}

linear::linear(size_t scratch_bytes, int gemv_max_tokens)
    : scratch_(scratch_bytes), gemv_max_tokens_(gemv_max_tokens) {}

void linear::run(const linear_weight& weight, const void* x, const void* bias, void* y, int tokens, dtype in_type,
                 dtype out_type, cudaStream_t stream) {
  if (tokens == 0) return;
  const int in = weight.in_features, out = weight.out_features;
  if (!weight.quantized()) {
    matmul_.run(x, weight.data(weight.parts.front()), bias, y, tokens, in, out, in_type, out_type, stream);
    return;
  }
  const size_t out_size = element_bytes(out_type), in_size = element_bytes(in_type);
  auto y_at = [&](int row) { return static_cast<char*>(y) + row * out_size; };
  auto bias_at = [&](int row) { return bias ? static_cast<const char*>(bias) + row * out_size : nullptr; };

  if (tokens <= gemv_max_tokens_) {
    for (const linear_part& part : weight.parts) {
      if (kept_quantized(part.type)) {
        quant_gemv(weight.data(part), part.type, weight.row_scales_from(part.first_row), part.rows, in, x, in, in_type,
                   tokens, bias_at(part.first_row), y_at(part.first_row), out, out_type, stream);
      } else {
        matmul_.run(x, weight.data(part), bias_at(part.first_row), y_at(part.first_row), tokens, in, part.rows, in_type,
                    out_type, stream, out);
      }
    }
    return;
  }

  const int slice = std::min(out, slice_rows(in, scratch_.size(), in_type));
  if (slice < 1) {
    throw std::runtime_error("CUDA linear: no dequantization scratch for a quantized [" + std::to_string(out) + ", " +
                             std::to_string(in) + "] weight at " + std::to_string(tokens) +
                             " tokens (this layer was sized for decode-sized calls)");
  }
  char* scratch = scratch_.as<char>();
  for (int r0 = 0; r0 < out; r0 += slice) {
    const int rows = std::min(slice, out - r0);
    for (const linear_part& part : weight.parts) {
      const int lo = std::max(r0, part.first_row), hi = std::min(r0 + rows, part.first_row + part.rows);
      if (lo >= hi) continue;
      char* target = scratch + static_cast<size_t>(lo - r0) * in * in_size;
      if (kept_quantized(part.type)) {
        dequantize_rows(weight.data(part), part.type, weight.row_scales_from(part.first_row), in, nullptr,
                        lo - part.first_row, hi - lo, target, in, in_type, stream);
      } else {
        const std::byte* source = weight.data(part) + static_cast<size_t>(lo - part.first_row) * in * in_size;
        check(cudaMemcpyAsync(target, source, static_cast<size_t>(hi - lo) * in * in_size, cudaMemcpyDeviceToDevice,
                              stream),
              "copy a plain weight slice");
      }
    }
    matmul_.run(x, scratch, bias_at(r0), y_at(r0), tokens, in, rows, in_type, out_type, stream, out);
  }
}

}  // namespace troupe::cuda
