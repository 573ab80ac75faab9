#pragma once
// The innermost loops of the CPU backend, one table per SIMD level (row_kernels_scalar.cpp,
// row_kernels_avx2.cpp, row_kernels_avx512.cpp). Weights are rows of `k` elements stored in
// their file's dtype; activations are f32.

#include <cstddef>
#include <cstdint>

#include "backends/cpu/simd_level.hpp"
#include "model/dtype.hpp"

namespace troupe::cpu {

// y[j * ldy + r] = dot(x[j * ldx .. + k], row r of w) for j < n, r < num_rows.
// `w` points at the first row; rows are row_bytes(type, k) apart.
using dot_rows_fn = void (*)(const float* x, int64_t n, int64_t ldx, const std::byte* w, int64_t k, int64_t num_rows,
                             float* y, int64_t ldy);

// dst[0 .. count) = the `count` elements at `src` as f32 (count: whole blocks of a quantized type).
using to_f32_fn = void (*)(const std::byte* src, int64_t count, float* dst);

// Scores of a tile of queries against a run of cached keys, and the weighted sum of values:
// the two halves of attention's inner loop (see paged_attention.cpp).
//   scores[q * num_keys + t] = scale * dot(queries[q * ldq ..], keys[t * ldk ..])   (head_dim)
using attention_scores_fn = void (*)(const float* queries, int64_t num_queries, int64_t ldq, const float* keys,
                                     int64_t num_keys, int64_t ldk, int64_t head_dim, float scale, float* scores);
//   out[q * ldo ..] += sum_t probs[q * num_keys + t] * values[t * ldv ..]
using attention_values_fn = void (*)(const float* probs, int64_t num_queries, int64_t num_keys, const float* values,
                                     int64_t ldv, int64_t head_dim, float* out, int64_t ldo);

// A prompt's product with float weights stored narrower than f32 (f16, bf16, fp8_e4m3: a
// conversion per element, no blocks), without converting the whole weight to f32 first. The
// activations are transposed once, in tiles of panel_tile_rows rows: xt[tile][k][panel_tile_rows]
// (the rows past n zero); then each call multiplies num_rows weight rows (`type`, converted by
// `convert`, the table's to_f32) with every tile, a few weight rows at a time converted into
// `scratch` while both stay in the core's cache (panel_scratch_floats(k, n, num_rows) floats):
//   y[j * ldy + r] = dot(x row j, weight row r) for j < n, r < num_rows,
// each a sum over k in order, one multiply-add per element.
using pack_activations_fn = void (*)(const float* x, int64_t n, int64_t ldx, int64_t k, float* xt);
using panel_gemm_fn = void (*)(const float* xt, int64_t n, int64_t k, const std::byte* w, dtype type, to_f32_fn convert,
                               int64_t num_rows, float* y, int64_t ldy, float* scratch);

// The weight types the panel kernels take (their elements convert one by one).
inline bool panel_weight_type(dtype type) {
  return type == dtype::f16 || type == dtype::bf16 || type == dtype::fp8_e4m3;
}

struct row_kernels {
  dot_rows_fn dot_rows[num_dtypes];    // indexed by dtype
  to_f32_fn to_f32[num_dtypes];        // indexed by dtype
  panel_gemm_fn panel_gemm = nullptr;  // for panel_weight_type()s; null where a level has none
  pack_activations_fn pack_activations = nullptr;
  int panel_tile_rows = 0;  // activation rows per tile of xt
  int panel_max_rows = 0;   // matmul takes the panels below this many activation rows
  size_t (*panel_scratch_floats)(int64_t k, int64_t n, int64_t max_rows) = nullptr;
  attention_scores_fn attention_scores;
  attention_values_fn attention_values;
};

const row_kernels& scalar_row_kernels();
const row_kernels& avx2_row_kernels();
const row_kernels& avx512_row_kernels();

// The table for `level` (active_simd_level() by default).
const row_kernels& kernels_for(simd_level level);
inline const row_kernels& active_kernels() { return kernels_for(active_simd_level()); }

}  // namespace troupe::cpu
