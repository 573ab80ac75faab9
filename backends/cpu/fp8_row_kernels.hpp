#pragma once
// Row kernels of the FP8 weight types (fp8_e4m3, fp8_e4m3_b128) for each SIMD level, put into
// that level's row_kernels table (row_kernels_<level>.cpp) in place of the generic fallback.
// fp8_e4m3's dot and conversion give the stored values without the checkpoint's row scales,
// which matmul applies to the outputs (weight_view::row_scales); fp8_e4m3_b128 carries its
// scales in its blocks.

#include "backends/cpu/row_kernels.hpp"

namespace troupe::cpu {

void add_fp8_row_kernels_scalar(row_kernels& table);
void add_fp8_row_kernels_avx2(row_kernels& table);
void add_fp8_row_kernels_avx512(row_kernels& table);

}  // namespace troupe::cpu
