#pragma once
// Rows of a quantized matrix decoded into an activation dtype: the embedding lookup of a
// quantized token table, and the prefill path's weight slices that cuBLASLt then multiplies
// (backends/cuda/linear.hpp). Each thread decodes one part of one block (quant_blocks.cuh) and
// stores its runs of 8 values with 16-byte stores; values are the reference dequantizer's,
// rounded once to the output dtype.

#include <cstdint>
#include <type_traits>

#include "backends/cuda/quant_blocks.cuh"
#if defined(__CUDACC__)
#include "backends/cuda/cuda_types.cuh"
#endif

namespace troupe::cuda {
TROUPE_BRANCHES_BEGIN

// The 8 values v as Out at p (16-byte aligned), rounded to nearest even.
template <typename Out>
TROUPE_HOST_DEVICE void store8(Out* p, const float* v) {
#if TROUPE_DEVICE_BRANCH
  if constexpr (std::is_same_v<Out, float>) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t words[4];  // two values a word, low half first
    TROUPE_UNROLL
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<Out, __half>) {
        words[i] = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v[2 * i]))) |
                   (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v[2 * i + 1]))) << 16);
      } else {
        words[i] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i]))) |
                   (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1]))) << 16);
      }
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  }
#else
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::logic_error("dequantize_rows: output not 16-byte aligned");
  for (int i = 0; i < 8; ++i) {
    if constexpr (std::is_same_v<Out, float>) {
      p[i] = v[i];
    } else {
      const uint16_t bits = std::is_same_v<Out, __half> ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(reinterpret_cast<unsigned char*>(p + i), &bits, 2);
    }
  }
#endif
}

// Item `item` of a row: part item % parts of block item / parts, stored at its elements of
// out_row, each value times the row's `scale` (1 without one; weight_rows_f32's product).
template <class Block, typename Out>
TROUPE_HOST_DEVICE void dequantize_item(const std::byte* row, int item, float scale, Out* out_row) {
  const int block = item / Block::parts, part = item % Block::parts;
  float values[Block::runs * 8];
  quant_blocks::decode_values<Block>(row + static_cast<int64_t>(block) * Block::bytes, part, values);
  TROUPE_UNROLL
  for (int i = 0; i < Block::runs * 8; ++i) values[i] = quant_blocks::mul_rn(values[i], scale);
  TROUPE_UNROLL
  for (int run = 0; run < Block::runs; ++run) {
    store8(out_row + static_cast<int64_t>(block) * Block::size + Block::run_start(part, run), values + run * 8);
  }
}

#if defined(__CUDACC__)

// One CTA per output row i: table row ids[i] (ids null: first_row + i).
// table [*, cols] in Block's type; row_scales [*] f32 or null; out [n, ldo] of Out.
template <class Block, typename Out>
__global__ void dequantize_rows_kernel(const std::byte* __restrict__ table, const float* __restrict__ row_scales,
                                       int64_t row_bytes, int cols, const int32_t* __restrict__ ids, int64_t first_row,
                                       Out* __restrict__ out, int64_t ldo) {
  const int64_t row = ids ? static_cast<int64_t>(ids[blockIdx.x]) : first_row + blockIdx.x;
  const float scale = row_scales ? row_scales[row] : 1.0f;
  const std::byte* source = table + row * row_bytes;
  Out* target = out + static_cast<int64_t>(blockIdx.x) * ldo;
  const int items = cols / Block::size * Block::parts;
  for (int item = threadIdx.x; item < items; item += blockDim.x) dequantize_item<Block>(source, item, scale, target);
}

#endif  // __CUDACC__

TROUPE_BRANCHES_END
}  // namespace troupe::cuda
