#pragma once
// Linear layers on one stream, whatever their weight's parts: y [tokens, out] (+ bias) =
// x [tokens, in] · Wᵀ.
//
// - A plain weight (one part in the activation dtype): one cuBLASLt product.
// - Quantized parts, decode-sized calls (tokens <= gemv_max_tokens): each part's blocks are read
//   in place by cuda::quant_gemv, which writes its slice of y.
// - Quantized parts, larger calls (prefill): the weight is dequantized a slice of rows at a time
//   into a scratch buffer of the activation dtype, and cuBLASLt multiplies each slice on the
//   tensor cores. The simplest prefill path that is compute-efficient: the dequantization reads
//   the quantized slice once and writes it once, work that is small against a prefill's product
//   once a step has a few hundred tokens (docs/design/models.md gives the trade-off; a fused
//   kernel that dequantizes tiles into shared memory is the step after, if measurements ask).
//
// Nothing allocates after construction and nothing waits on the host: a step through here can
// be captured in a CUDA graph. Each stream (nano-batch lane) needs its own `linear`: the scratch
// and the cuBLASLt workspace are per object.

#include <cuda_runtime.h>

#include <cstddef>

#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/linear_weight.hpp"
#include "backends/cuda/matmul.hpp"

namespace troupe::cuda {

// The largest decode-sized call, by default: up to 8 tokens share one read of the weights
// (quant_gemv's token tile); above, the dequantize-and-multiply path takes over.
inline constexpr int default_gemv_max_tokens = 8;
// Scratch for dequantized slices, by default: big enough that a slice's product fills the GPU
// (64 MiB of bf16 is 8192 rows of a 4096-wide layer), small beside the weights it serves.
inline constexpr size_t default_dequantize_scratch_bytes = size_t{64} << 20;

// Rows of a [*, in_features] weight that one slice of `scratch_bytes` holds in `activation`:
// a multiple of 128 (cuBLASLt's outputs stay 256-byte aligned) when at least 128 fit.
int slice_rows(int in_features, size_t scratch_bytes, dtype activation);

// The scratch `weight` needs for its larger calls with at most `cap` bytes (0 for a plain one).
size_t dequantize_scratch_bytes(const linear_weight& weight, dtype activation, size_t cap);

class linear {
 public:
  // scratch_bytes: room for one slice of the largest quantized weight this object will run
  // (dequantize_scratch_bytes); 0 when none is quantized.
  linear(size_t scratch_bytes, int gemv_max_tokens = default_gemv_max_tokens);

  // x [tokens, in_features] of in_type (the activation dtype, also that of the weight's plain
  // parts); bias [out_features] of out_type or null; y [tokens, out_features] of out_type.
  void run(const linear_weight& weight, const void* x, const void* bias, void* y, int tokens, dtype in_type,
           dtype out_type, cudaStream_t stream);

  matmul& plain() { return matmul_; }

 private:
  matmul matmul_;
  device_buffer scratch_;  // [slice rows, in_features] of the activation dtype
  int gemv_max_tokens_;
};

}  // namespace troupe::cuda
