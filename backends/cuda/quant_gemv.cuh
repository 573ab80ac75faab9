#pragma once
// Decode-sized linear layers with quantized weights: y [tokens, rows] = x [tokens, cols] · Wᵀ
// (+ bias), W in a GGUF block type, read straight from its blocks.
//
// Why this shape. A decode step reads every weight once and does almost nothing with it, so the
// product runs at the speed weights cross from memory. Each thread decodes its part of a block
// (quant_blocks.cuh) into f32 registers (the codes, and the scale and min of each run of 8) and
// multiplies them with the activations of up to 8 tokens: a block is read once for all the
// tokens of a call (more than 8 tokens: one more pass over the weights per 8). The alternative,
// llama.cpp's mmvq, quantizes the activations to int8 and uses dp4a: cheaper arithmetic per
// weight (it pays off from 4-8 tokens up, where f32 FMAs start to bound a 4-bit GEMV), but it
// adds an activation quantization kernel and its error, and a second code path per type. Decoding
// to f32 keeps one decoder per type shared with the prefill dequantizer, and results the CPU
// backend matches to f32 rounding; the int8 path is the next step if measurements show decode
// batches bound by arithmetic (docs/design/models.md).
//
// Work split: a CTA of 4 warps computes 2 weight rows (each activation load serves both) for up
// to 8 tokens; its 128 threads split the row's blocks, `parts` threads a block, and the CTA
// reduces through shared memory. Plenty of CTAs even for a [1024, 4096] projection, no
// allocation and no host synchronization: graph-capturable.
//
// gemv_partial, the per-thread body, compiles for the host too: the host tests run it for every
// thread of a CTA and check the sums, with no GPU.

#include <cstdint>
#include <type_traits>

#include "backends/cuda/quant_blocks.cuh"
#if defined(__CUDACC__)
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cuda_types.cuh"
#endif

namespace troupe::cuda {
TROUPE_BRANCHES_BEGIN

struct quant_gemv_params {
  const std::byte* weight = nullptr;  // [rows, cols / block size] blocks, row r at weight + r * row_bytes
  int64_t row_bytes = 0;
  int rows = 0, cols = 0;
  const void* x = nullptr;  // [tokens, ldx] of the activation dtype, 16-byte aligned, ldx % 8 == 0
  int64_t ldx = 0;
  int tokens = 0;
  const float* row_scale = nullptr;  // [rows] f32 multiplying each row's sum (a checkpoint's scales), or null
  const void* bias = nullptr;        // [rows] of out_type, or null
  void* y = nullptr;                 // [tokens, ldy] of out_type
  int64_t ldy = 0;
  dtype out_type = dtype::f32;
};

inline constexpr int gemv_warps = 4;         // warps of a CTA, splitting a row's blocks
inline constexpr int gemv_rows_per_cta = 2;  // weight rows a CTA computes together
inline constexpr int gemv_max_tile_tokens = 8;

// Activations: the 8 values at p (16-byte aligned) as floats.
template <typename In>
TROUPE_HOST_DEVICE void load8(const In* p, float (&v)[8]) {
#if TROUPE_DEVICE_BRANCH
  if constexpr (std::is_same_v<In, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    // One 16-byte load; each 32-bit word holds two values, low half first. Unpacked from the
    // bits (a bfloat16 is the top half of its float), never through a pointer of another type.
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    TROUPE_UNROLL
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<In, __half>) {
        v[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] & 0xffffu)));
        v[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
      } else {
        v[2 * i] = __uint_as_float(words[i] << 16);
        v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  }
#else
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::logic_error("quant_gemv: activations not 16-byte aligned");
  for (int i = 0; i < 8; ++i) {
    if constexpr (std::is_same_v<In, float>) {
      v[i] = p[i];
    } else {
      uint16_t bits;
      std::memcpy(&bits, p + i, 2);
      v[i] = std::is_same_v<In, __half> ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
#endif
}

TROUPE_HOST_DEVICE float fma_acc(float a, float b, float acc) {
#if TROUPE_DEVICE_BRANCH
  return __fmaf_rn(a, b, acc);
#else
  return a * b + acc;
#endif
}

// Thread `worker` of the `num_workers` of a CTA (a multiple of Block::parts) adds its share of
// rows [0, valid_rows) of `weight` times tokens [0, valid_tokens) of `x` into acc[row][token]:
// blocks worker / parts, + num_workers / parts, ..., part worker % parts of each. Rows past
// valid_rows re-read row 0 (their sums are never stored); tokens past valid_tokens are skipped.
// Per run of 8: scale * sum(code * x) (- min * sum(x)), the codes being small integers or levels:
// one multiply-add per weight and token, the scales once per run.
template <class Block, int Rows, int Tokens, typename In>
TROUPE_HOST_DEVICE void gemv_partial(const std::byte* weight, int64_t row_bytes, int valid_rows, int num_blocks,
                                     const In* x, int64_t ldx, int valid_tokens, int worker, int num_workers,
                                     float (&acc)[Rows][Tokens]) {
  constexpr int values = Block::runs * 8;
  const int part = worker % Block::parts;
  const int stride = num_workers / Block::parts;
  const std::byte* row_weight[Rows];
  TROUPE_UNROLL
  for (int r = 0; r < Rows; ++r) row_weight[r] = weight + (r < valid_rows ? r : 0) * row_bytes;
  for (int b = worker / Block::parts; b < num_blocks; b += stride) {
    float codes[Rows][values], scale[Rows][Block::runs], min[Rows][Block::runs];
    TROUPE_UNROLL
    for (int r = 0; r < Rows; ++r) {
      Block::decode(row_weight[r] + static_cast<int64_t>(b) * Block::bytes, part, codes[r], scale[r], min[r]);
    }
    TROUPE_UNROLL
    for (int run = 0; run < Block::runs; ++run) {
      const int64_t k = static_cast<int64_t>(b) * Block::size + Block::run_start(part, run);
      TROUPE_UNROLL
      for (int t = 0; t < Tokens; ++t) {
        if (t >= valid_tokens) break;
        float xv[8];
        load8(x + t * ldx + k, xv);
        float x_sum = 0.0f;
        if constexpr (Block::has_min) {
          TROUPE_UNROLL
          for (int j = 0; j < 8; ++j) x_sum += xv[j];
        }
        TROUPE_UNROLL
        for (int r = 0; r < Rows; ++r) {
          float dot = 0.0f;
          TROUPE_UNROLL
          for (int j = 0; j < 8; ++j) dot = fma_acc(codes[r][run * 8 + j], xv[j], dot);
          acc[r][t] = fma_acc(scale[r][run], dot, acc[r][t]);
          if constexpr (Block::has_min) acc[r][t] = fma_acc(-min[r][run], x_sum, acc[r][t]);
        }
      }
    }
  }
}

#if defined(__CUDACC__)

// y[token, row] = value (* row_scale[row]) (+ bias[row]) in the output dtype.
__device__ __forceinline__ void store_gemv_output(const quant_gemv_params& p, int token, int row, float value) {
  const int64_t at = static_cast<int64_t>(token) * p.ldy + row;
  if (p.row_scale) value *= p.row_scale[row];
  switch (p.out_type) {
    case dtype::f16:
      if (p.bias) value += __half2float(static_cast<const __half*>(p.bias)[row]);
      static_cast<__half*>(p.y)[at] = __float2half_rn(value);
      break;
    case dtype::bf16:
      if (p.bias) value += __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[row]);
      static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(value);
      break;
    default:
      if (p.bias) value += static_cast<const float*>(p.bias)[row];
      static_cast<float*>(p.y)[at] = value;
      break;
  }
}

// grid (ceil(rows / gemv_rows_per_cta), ceil(tokens / Tokens)), block gemv_warps * 32.
template <class Block, int Tokens, typename In>
__global__ void __launch_bounds__(gemv_warps * 32) quant_gemv_kernel(quant_gemv_params p) {
  constexpr int Rows = gemv_rows_per_cta;
  const int row0 = blockIdx.x * Rows, token0 = blockIdx.y * Tokens;
  const int valid_rows = min(Rows, p.rows - row0), valid_tokens = min(Tokens, p.tokens - token0);
  float acc[Rows][Tokens];
  TROUPE_UNROLL
  for (int r = 0; r < Rows; ++r) {
    TROUPE_UNROLL
    for (int t = 0; t < Tokens; ++t) acc[r][t] = 0.0f;
  }
  gemv_partial<Block, Rows, Tokens, In>(p.weight + static_cast<int64_t>(row0) * p.row_bytes, p.row_bytes, valid_rows,
                                        p.cols / Block::size, static_cast<const In*>(p.x) + token0 * p.ldx, p.ldx,
                                        valid_tokens, threadIdx.x, blockDim.x, acc);
  __shared__ float partial[gemv_warps][Rows][Tokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  TROUPE_UNROLL
  for (int r = 0; r < Rows; ++r) {
    TROUPE_UNROLL
    for (int t = 0; t < Tokens; ++t) {
      const float sum = warp_sum(acc[r][t]);
      if (lane == 0) partial[warp][r][t] = sum;
    }
  }
  __syncthreads();
  if (threadIdx.x < Rows * Tokens) {
    const int r = threadIdx.x / Tokens, t = threadIdx.x % Tokens;
    if (r < valid_rows && t < valid_tokens) {
      float sum = 0.0f;
      TROUPE_UNROLL
      for (int w = 0; w < gemv_warps; ++w) sum += partial[w][r][t];
      store_gemv_output(p, token0 + t, row0 + r, sum);
    }
  }
}

// Launches the kernel for Block on `stream`: one token tile for a single token, tiles of 8 above.
template <class Block>
void launch_quant_gemv(const quant_gemv_params& p, dtype in_type, cudaStream_t stream) {
  dispatch_activation(in_type, "quantized matmul", [&](auto tag) {
    using In = decltype(tag);
    const dim3 threads(gemv_warps * 32);
    if (p.tokens == 1) {
      quant_gemv_kernel<Block, 1, In><<<dim3(ceil_div(p.rows, gemv_rows_per_cta), 1), threads, 0, stream>>>(p);
    } else {
      const dim3 grid(ceil_div(p.rows, gemv_rows_per_cta), ceil_div(p.tokens, gemv_max_tile_tokens));
      quant_gemv_kernel<Block, gemv_max_tile_tokens, In><<<grid, threads, 0, stream>>>(p);
    }
    check_launch("quant_gemv_kernel");
  });
}

// One per family of types (a .cu each, so nvcc compiles them apart): false for a type not theirs.
bool quant_gemv_legacy(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream);
bool quant_gemv_k(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream);
bool quant_gemv_nonlinear(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream);
bool quant_gemv_fp8(dtype weight_type, const quant_gemv_params& p, dtype in_type, cudaStream_t stream);

#endif  // __CUDACC__

TROUPE_BRANCHES_END
}  // namespace troupe::cuda
