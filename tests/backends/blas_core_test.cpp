// OpenBLAS's kernel choice: a core below the CPU's SIMD level is replaced by one that fits, a
// core OpenBLAS chose for a CPU it knows is kept; its threads are asked to sleep once a product is
// done, unless the user chose otherwise. (The restart itself is checked on the real binary:
// generate_e2e's the_prompt_runs_on_openblas_kernels_that_fit_the_cpu.)

#include <gtest/gtest.h>

#include "backends/cpu/blas_core.hpp"

namespace troupe::cpu {
namespace {

TEST(blas_core, a_fallback_core_is_replaced_by_the_best_the_cpu_runs) {
  EXPECT_EQ(better_blas_core(simd_level::avx512_vnni, "Prescott"), "SkylakeX");
  EXPECT_EQ(better_blas_core(simd_level::avx512, "prescott"), "SkylakeX");
  EXPECT_EQ(better_blas_core(simd_level::avx2, "Prescott"), "Haswell");
  EXPECT_EQ(better_blas_core(simd_level::avx2, "Nehalem"), "Haswell");
  EXPECT_EQ(better_blas_core(simd_level::avx512, "Sandybridge"), "SkylakeX");  // AVX without AVX2
}

TEST(blas_core, a_core_with_avx2_kernels_or_better_is_kept) {
  for (const char* known : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "skylakex"}) {
    EXPECT_EQ(better_blas_core(simd_level::avx512_vnni, known), "") << known;
    EXPECT_EQ(better_blas_core(simd_level::avx2, known), "") << known;
  }
}

TEST(blas_core, a_cpu_without_avx2_keeps_what_openblas_chose) {
  EXPECT_EQ(better_blas_core(simd_level::scalar, "Prescott"), "");
}

TEST(blas_core, a_restart_sets_what_is_missing_and_keeps_what_the_user_set) {
  using settings = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(blas_settings_to_set(simd_level::avx512_vnni, "Prescott", false, false),
            (settings{{"OPENBLAS_CORETYPE", "SkylakeX"}, {"OPENBLAS_THREAD_TIMEOUT", "4"}}));
  EXPECT_EQ(blas_settings_to_set(simd_level::avx512_vnni, "SkylakeX", false, false),
            (settings{{"OPENBLAS_THREAD_TIMEOUT", "4"}}));
  EXPECT_EQ(blas_settings_to_set(simd_level::avx2, "Prescott", true, false),
            (settings{{"OPENBLAS_THREAD_TIMEOUT", "4"}}));
  EXPECT_EQ(blas_settings_to_set(simd_level::avx2, "Prescott", false, true),
            (settings{{"OPENBLAS_CORETYPE", "Haswell"}}));
  EXPECT_TRUE(blas_settings_to_set(simd_level::avx512, "Prescott", true, true).empty());  // after a restart
}

TEST(blas_core, this_process_names_the_core_it_runs) { EXPECT_FALSE(blas_core_name().empty()); }

}  // namespace
}  // namespace troupe::cpu
