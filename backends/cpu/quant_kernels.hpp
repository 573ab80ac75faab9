#pragma once
// Integer kernels for the quantized weight types (q4_0 ... mxfp4), one table per SIMD level
// (quant_kernels_scalar.cpp, _avx2.cpp, _avx512.cpp, _avx512vnni.cpp).
//
// y = x · wᵀ with quantized w: each activation row is quantized once per product into blocks of
// 32 int8 values with an f32 scale (act_block); the weights' blocks are read as integer codes
// and sub-block scales (quant_codes.hpp) and multiplied by the int8 activations exactly in
// int32, one sub-block at a time, then scaled in f32. An output element goes through the same
// operations in the same order whatever else is computed beside it (1 activation row or
// hundreds, any split of weight rows over threads, any SIMD level), so a sequence's result never
// depends on its batch: "the canonical sum" in quant_kernels_impl.hpp.

#include <cstddef>
#include <cstdint>

#include "backends/cpu/row_kernels.hpp"
#include "backends/cpu/simd_level.hpp"
#include "model/dtype.hpp"

namespace troupe::cpu {

// 32 activations as int8: x[i] ≈ d * q[i], q in [-127, 127], d = max|x| / 127 (NaN when a value
// is not finite, so the products come out NaN as they would in f32).
struct act_block {
  float d;
  // d * Σq over each sub-block of the weights it meets: [0] over all 32 values when the weights'
  // sub-blocks are 32 wide, [0] and [1] over each half when they are 16 wide. Used by the types
  // with a min (its share of the product is min * Σx).
  float dsum[2];
  // offset * Σq over the same spans: kernels that shift signed codes to unsigned bytes take the
  // shift's share back out of the integer dot with it.
  int32_t corr[2];
  int8_t q[32];
};
static_assert(sizeof(act_block) == 52);

// Quantizes one row of k activations (k a multiple of 32) into k / 32 blocks, for weights of the
// table's type.
using quantize_acts_fn = void (*)(const float* x, int64_t k, act_block* out);

// y[j * ldy + r] = row r of w · activation row j, for r < num_rows, j < n. w points at the first
// weight row (rows row_bytes(type, k) apart); x holds n rows of k / 32 blocks; scratch is this
// thread's, at least scratch_bytes(n, k) bytes.
using quant_matmul_fn = void (*)(const std::byte* w, int64_t k, int64_t num_rows, const act_block* x, int64_t n,
                                 float* y, int64_t ldy, std::byte* scratch);

struct quant_kernels {
  // Indexed by dtype; null for the types these kernels do not cover (f32, f16, bf16, fp8_e4m3).
  quantize_acts_fn quantize_acts[num_dtypes];
  quant_matmul_fn matmul[num_dtypes];
  to_f32_fn to_f32[num_dtypes];  // bit for bit the reference dequantizer's floats
  // Over weights repacked for this level (quant_repack.hpp): w is the repacked tile of the first
  // row asked for (rows from a multiple of repack_rows on). Null for the types without a repacked
  // layout and on the scalar level; the same bits as `matmul` on the GGUF bytes.
  quant_matmul_fn matmul_repacked[num_dtypes];
  int repack_rows;  // R: rows per repacked tile for this level (0: no repacking)
  size_t (*scratch_bytes)(int64_t n, int64_t k);
};

const quant_kernels& scalar_quant_kernels();
const quant_kernels& avx2_quant_kernels();
const quant_kernels& avx512_quant_kernels();       // AVX-512 BW without VNNI (maddubs)
const quant_kernels& avx512_vnni_quant_kernels();  // vpdpbusd

// The table for `level` (active_simd_level() by default).
const quant_kernels& quant_kernels_for(simd_level level);
inline const quant_kernels& active_quant_kernels() { return quant_kernels_for(active_simd_level()); }

}  // namespace troupe::cpu
