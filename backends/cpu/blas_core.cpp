#include "backends/cpu/blas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace troupe::cpu {

namespace {

// OpenBLAS's x86-64 cores with AVX2 kernels or better (lower case, as compared): a CPU OpenBLAS
// recognized lands on one of these, and its choice is kept.
constexpr std::array<std::string_view, 5> avx2_or_better_cores = {"haswell", "zen", "skylakex", "cooperlake",
                                                                  "sapphirerapids"};

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

std::string better_blas_core(simd_level level, std::string_view chosen) {
  const std::string name = lower(chosen);
  if (std::find(avx2_or_better_cores.begin(), avx2_or_better_cores.end(), name) != avx2_or_better_cores.end()) {
    return "";
  }
  switch (level) {
    case simd_level::avx512:
    case simd_level::avx512_vnni: return "SkylakeX";
    case simd_level::avx2: return "Haswell";
    case simd_level::scalar: return "";
  }
  return "";
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

void restart_with_fitting_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or our restart's
  const std::string chosen = blas_core_name();
  const std::string better = better_blas_core(detected_simd_level(), chosen);
  if (better.empty()) return;
  if (::setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Still here: the exec failed. Logging is not set up this early; stderr carries the warning.
  std::fprintf(stderr,
               "warning: OpenBLAS runs its '%s' kernels on this CPU, which can run '%s'; restarting with "
               "OPENBLAS_CORETYPE=%s failed (%s): float prompts run several times slower. Set "
               "OPENBLAS_CORETYPE=%s in the environment.\n",
               chosen.c_str(), better.c_str(), better.c_str(), std::strerror(errno), better.c_str());
}

}  // namespace troupe::cpu
