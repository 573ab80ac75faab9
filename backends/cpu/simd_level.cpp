#include "backends/cpu/simd_level.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

namespace troupe::cpu {

namespace {
// -1: nothing forced; otherwise the forced simd_level.
std::atomic<int> forced_level{-1};
}  // namespace

std::string_view simd_level_name(simd_level level) {
  switch (level) {
    case simd_level::scalar: return "scalar";
    case simd_level::avx2: return "avx2";
    case simd_level::avx512: return "avx512";
    case simd_level::avx512_vnni: return "avx512_vnni";
  }
  return "unknown";
}

bool simd_level_supported(simd_level level) {
  switch (level) {
    case simd_level::scalar: return true;
    case simd_level::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case simd_level::avx512:
      return simd_level_supported(simd_level::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    case simd_level::avx512_vnni:
      return simd_level_supported(simd_level::avx512) && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

simd_level detected_simd_level() {
  static const simd_level level = [] {
    if (simd_level_supported(simd_level::avx512_vnni)) return simd_level::avx512_vnni;
    if (simd_level_supported(simd_level::avx512)) return simd_level::avx512;
    if (simd_level_supported(simd_level::avx2)) return simd_level::avx2;
    return simd_level::scalar;
  }();
  return level;
}

simd_level active_simd_level() {
  int forced = forced_level.load(std::memory_order_relaxed);
  return forced < 0 ? detected_simd_level() : static_cast<simd_level>(forced);
}

void force_simd_level(simd_level level) {
  if (!simd_level_supported(level)) {
    throw std::runtime_error("cannot force SIMD level '" + std::string(simd_level_name(level)) +
                             "': this CPU does not support it");
  }
  forced_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void clear_forced_simd_level() { forced_level.store(-1, std::memory_order_relaxed); }

}  // namespace troupe::cpu
