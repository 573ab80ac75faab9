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

std::vector<std::pair<std::string, std::string>> blas_settings_to_set(simd_level level, std::string_view chosen,
                                                                      bool coretype_set, bool thread_timeout_set) {
  std::vector<std::pair<std::string, std::string>> settings;
  if (!coretype_set) {
    const std::string better = better_blas_core(level, chosen);
    if (!better.empty()) settings.emplace_back("OPENBLAS_CORETYPE", better);
  }
  if (!thread_timeout_set) settings.emplace_back("OPENBLAS_THREAD_TIMEOUT", blas_thread_timeout);
  return settings;
}

void restart_with_blas_settings(char** argv) {
  const std::string chosen = blas_core_name();
  const auto settings = blas_settings_to_set(detected_simd_level(), chosen, std::getenv("OPENBLAS_CORETYPE") != nullptr,
                                             std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr);
  if (settings.empty()) return;
  std::string named;
  for (const auto& [name, value] : settings) {
    if (::setenv(name.c_str(), value.c_str(), 1) != 0) return;
    named += (named.empty() ? "" : " ") + name + "=" + value;
  }
  ::execv("/proc/self/exe", argv);
  // Still here: the exec failed. Logging is not set up this early; stderr carries the warning.
  std::fprintf(stderr,
               "warning: restarting with %s failed (%s): OpenBLAS runs its '%s' kernels and polls for work "
               "after each product; set %s in the environment.\n",
               named.c_str(), std::strerror(errno), chosen.c_str(), named.c_str());
}

}  // namespace troupe::cpu
