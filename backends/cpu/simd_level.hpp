#pragma once
// Which SIMD kernels the CPU backend runs. Chosen once at run time from what the CPU reports
// (never from -march=native), and overridable so tests can force every path the machine has.

#include <string_view>

namespace troupe::cpu {

enum class simd_level {
  scalar,       // portable C++; runs anywhere
  avx2,         // AVX2 + FMA + F16C
  avx512,       // AVX-512 F/BW/VL/DQ (+ the AVX2 set)
  avx512_vnni,  // the AVX-512 set + VNNI (vpdpbusd: int8 dot products for the quantized types)
};

std::string_view simd_level_name(simd_level level);

// The best level this CPU supports.
simd_level detected_simd_level();
// True when the CPU can run kernels of `level`.
bool simd_level_supported(simd_level level);

// The level kernels use now: the forced one if any, else the detected one.
simd_level active_simd_level();
// Forces `level` for every later kernel call (tests). Throws std::runtime_error when the CPU
// cannot run it.
void force_simd_level(simd_level level);
void clear_forced_simd_level();

}  // namespace troupe::cpu
