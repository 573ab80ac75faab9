#pragma once
// y = x · wᵀ for f32 activations and a linear layer's weight in any weight dtype.
//
// Quantized weights (q4_0 ... mxfp4) go through the integer kernels for any number of rows
// (quant_kernels.hpp): the activations are quantized to int8 once per call and each thread
// multiplies tiles of weight rows. Other weights take one of three strategies, chosen by the
// number of activation rows n:
// - n < matmul_gemm_min_rows() (32; decode of up to 31 sequences): every thread takes a
//   contiguous range of weight rows and streams them once, dotting pairs of rows with groups of
//   up to four activations in registers (SIMD row kernels): memory-bandwidth bound for a few
//   rows, FMA-bound for more, each weight read once per step;
// - from there to 511 rows (127 on AVX2), f16, bf16 and fp8_e4m3 weights take the panel kernels
//   (row_kernels.hpp): the activations transposed once, then each thread multiplies its weight
//   rows eight at a time (six on AVX2), converted to f32 into its cache, against every tile of
//   activations, taking k in chunks that keep the activations' share in L2. The weight is read
//   as stored, never written out as f32 nor repacked: 1.5-1.7x the slabs + sgemm below at 32
//   decode streams of a 1.1 B F16 model, 1.2-1.3x on its 128-token prompt (docs/benchmarks.md);
// - other weights (and those on a level without panel kernels, or with
//   set_matmul_float_panels(false)) from 32 to 127 rows (larger decode batches, short
//   chunks): the pool's threads take slabs of weight rows and multiply each with a
//   single-threaded OpenBLAS sgemm; a weight in another dtype is converted one small slab at a
//   time (~256 KiB of f32, kept in the core's cache), an f32 weight is used in place;
// - and 128 rows and more (prefill): one sgemm on OpenBLAS's threads (as many as the pool's)
//   over the whole f32 weight, or over slabs of at most 64 MiB converted to f32 by the pool
//   first (compute bound; the conversion is O(m·k) against O(n·m·k) of arithmetic).

#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "model/dtype.hpp"
#include "model/weight_store.hpp"

namespace troupe::cpu {

// A weight matrix [rows, cols] in its stored dtype (rows contiguous, row_bytes(type, cols) apart).
// A quantized checkpoint's row scales and column order (weight_tensor) come along: matmul gathers
// the activations into the stored column order before the product and scales each output after.
struct weight_view {
  dtype type = dtype::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  const std::byte* data = nullptr;
  const float* row_scales = nullptr;     // [rows] or null: output r is multiplied by row_scales[r]
  const int32_t* input_order = nullptr;  // [cols] or null: stored column j multiplies x[input_order[j]]
  // The same matrix repacked at load (quant_repack.hpp) in tiles of repack_rows rows, or null:
  // the integer kernels read it instead of `data` when their level's tile has that many rows.
  const std::byte* repacked = nullptr;
  int repack_rows = 0;
};

// Views a 2-D weight tensor; throws std::runtime_error when it is not 2-D or not [rows, cols],
// or its row scales or column order do not fit.
weight_view view_of(const weight_tensor& tensor, int64_t rows, int64_t cols);

// Below this many activation rows matmul uses the row-streaming path, from it on sgemm.
int matmul_gemm_min_rows();
// Tests and benchmarks move the switch point (e.g. 1 forces sgemm, INT32_MAX forces dots).
void set_matmul_gemm_min_rows(int rows);

// Whether quantized weights go through the integer kernels (quant_kernels.hpp; the default) or,
// when off, through f32 conversions like f16 weights: the path they took before the integer
// kernels, kept so benchmarks can measure one against the other.
bool matmul_integer_kernels();
void set_matmul_integer_kernels(bool on);

// Whether matmul gives an activation row the same bits whatever else rides in the batch, for a
// weight stored as `type`: the integer kernels' types (one canonical sum at every row count),
// and float weights while they take the row dots at every count.
bool matmul_batch_invariant(dtype type);

// Whether float weights (f32, f16, bf16) take the row dots at every activation count, blocked
// for the caches, so that their products are batch invariant too (`--batch-invariant`: prompts
// of a float model cost about 1.3x, measured with troupe_bench_quant), or sgemm from
// matmul_gemm_min_rows rows on (the default), which sums in its own order. Process-wide: set
// before a model is built, since the KV cache's default dtype follows it
// (backend_selection.hpp).
bool matmul_float_rows_at_every_count();
void set_matmul_float_rows_at_every_count(bool on);

// Whether f16, bf16 and fp8_e4m3 weights take the panel kernels from matmul_gemm_min_rows up to
// the level's row_kernels::panel_max_rows (the default; row_kernels.hpp, panel_gemm_fn) or, when
// off, the f32 slabs + sgemm they took before, kept so benchmarks can measure one against the
// other.
bool matmul_float_panels();
void set_matmul_float_panels(bool on);

// y [n, w.rows] = x [n, w.cols] · wᵀ. `scratch` holds converted weight slabs between calls
// (grown on demand, so steady-state steps do not allocate).
void matmul(thread_pool& pool, const float* x, int64_t n, const weight_view& w, float* y, std::vector<float>& scratch);

}  // namespace troupe::cpu
