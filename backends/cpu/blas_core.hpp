#pragma once
// Which kernels OpenBLAS runs, and the fix for a CPU it does not know.
//
// OpenBLAS chooses its kernels ("core") once, while the library loads, from the CPU models its
// build knows. A CPU newer than the build gets its generic "Prescott" kernels (SSE3): Debian 12's
// OpenBLAS 0.3.21 does that on Intel's Emerald Rapids (family 6, model 207). On such an AVX-512
// machine every sgemm then runs about 4x slower, and with it every prompt of a float model (a
// 512-token prompt of a 16-layer F16 model: 128 against 551 tok/s; docs/benchmarks.md,
// "OpenBLAS on a CPU it does not know"). OPENBLAS_CORETYPE overrides the choice, but OpenBLAS
// reads it only while loading, so a program that finds the wrong core sets it and starts over.

#include <string>
#include <string_view>

#include "backends/cpu/simd_level.hpp"

namespace troupe::cpu {

// The OpenBLAS core name to ask for (OPENBLAS_CORETYPE) on a CPU of SIMD level `level` when
// OpenBLAS chose `chosen`: "SkylakeX" for AVX-512, "Haswell" for AVX2; empty when `chosen` already
// runs AVX2 kernels or better (OpenBLAS knew the CPU: its choice stands) or the CPU has no AVX2.
std::string better_blas_core(simd_level level, std::string_view chosen);

// The core OpenBLAS runs in this process, as OpenBLAS names it (e.g. "SkylakeX", "Prescott").
std::string blas_core_name();

// For the first line of a program's main, before any thread starts: when OpenBLAS chose a core
// below this CPU's (better_blas_core) and OPENBLAS_CORETYPE is not set, sets it and executes the
// program again (same arguments and environment plus that variable, same process id). Returns
// when there is nothing to do, or when the exec failed (it says so on stderr; the program then
// runs on, slower).
void restart_with_fitting_blas_core(char** argv);

}  // namespace troupe::cpu
