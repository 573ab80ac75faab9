#pragma once
// Which kernels OpenBLAS runs, the fix for a CPU it does not know, and how long its threads poll.
//
// OpenBLAS chooses its kernels ("core") once, while the library loads, from the CPU models its
// build knows. A CPU newer than the build gets its generic "Prescott" kernels (SSE3): Debian 12's
// OpenBLAS 0.3.21 does that on Intel's Emerald Rapids (family 6, model 207). On such an AVX-512
// machine every sgemm then runs about 4x slower, and with it every prompt of a float model (a
// 512-token prompt of a 16-layer F16 model: 128 against 551 tok/s; docs/benchmarks.md,
// "OpenBLAS on a CPU it does not know"). OPENBLAS_CORETYPE overrides the choice, but OpenBLAS
// reads it only while loading, so a program that finds the wrong core sets it and starts over.
//
// The same goes for how long OpenBLAS's own threads poll for the next product once one is done:
// 2^28 cycles by default (~0.1 s), yielding the core between polls. A server's float prompts of
// 128 rows or more run on those threads, and after each one they polled on through the decode
// steps that followed, beside the model's own threads, the serving stack and the clients: a
// 2-thread server of the 12-layer bench model spent a quarter of its CPU samples in OpenBLAS's
// threads, two thirds of that in sched_yield (perf, 10 req/s). OPENBLAS_THREAD_TIMEOUT=4 (2^4
// cycles, OpenBLAS's least) has them sleep as soon as a product is done.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cpu/simd_level.hpp"

namespace troupe::cpu {

// The OpenBLAS core name to ask for (OPENBLAS_CORETYPE) on a CPU of SIMD level `level` when
// OpenBLAS chose `chosen`: "SkylakeX" for AVX-512, "Haswell" for AVX2; empty when `chosen` already
// runs AVX2 kernels or better (OpenBLAS knew the CPU: its choice stands) or the CPU has no AVX2.
std::string better_blas_core(simd_level level, std::string_view chosen);

// The core OpenBLAS runs in this process, as OpenBLAS names it (e.g. "SkylakeX", "Prescott").
std::string blas_core_name();

// The thread timeout this program asks OpenBLAS for (OPENBLAS_THREAD_TIMEOUT).
inline constexpr const char* blas_thread_timeout = "4";

// The OpenBLAS variables to set before it loads again, as (name, value): OPENBLAS_CORETYPE when
// OpenBLAS chose `chosen` below this CPU's `level` (better_blas_core) and the variable is not set
// (`coretype_set`: the user's choice, or an earlier restart's); OPENBLAS_THREAD_TIMEOUT when it is
// not set. Empty: nothing to do.
std::vector<std::pair<std::string, std::string>> blas_settings_to_set(simd_level level, std::string_view chosen,
                                                                      bool coretype_set, bool thread_timeout_set);

// For the first line of a program's main, before any thread starts: when blas_settings_to_set
// names any, sets them and executes the program again (same arguments and environment plus
// those variables, same process id). Returns when there is nothing to do, or when the exec
// failed (it says so on stderr; the program then runs on, slower).
void restart_with_blas_settings(char** argv);

}  // namespace troupe::cpu
