// cuBLASLt is loaded on first use (backends/cuda/cublaslt_library.hpp): every entry point the
// backend calls resolves from the toolkit's library. Loading needs no GPU, so this runs anywhere
// the CUDA backend is built.

#include <gtest/gtest.h>

#include "backends/cuda/cublaslt_library.hpp"

namespace troupe::cuda {
namespace {

TEST(cublaslt_library, every_entry_point_resolves_and_a_second_call_returns_the_same_table) {
  const cublaslt_api& api = cublaslt();
  EXPECT_TRUE(cublaslt_loaded());
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.matmul, nullptr);
  EXPECT_NE(api.algo_get_heuristic, nullptr);
  EXPECT_NE(api.desc_create, nullptr);
  EXPECT_NE(api.desc_destroy, nullptr);
  EXPECT_NE(api.desc_set_attribute, nullptr);
  EXPECT_NE(api.preference_create, nullptr);
  EXPECT_NE(api.preference_destroy, nullptr);
  EXPECT_NE(api.preference_set_attribute, nullptr);
  EXPECT_NE(api.layout_create, nullptr);
  EXPECT_NE(api.layout_destroy, nullptr);
  EXPECT_EQ(&cublaslt(), &api);
  // A layout needs no device: the loaded library answers a real call.
  cublasLtMatrixLayout_t layout = nullptr;
  EXPECT_EQ(api.layout_create(&layout, CUDA_R_32F, 4, 4, 4), CUBLAS_STATUS_SUCCESS);
  if (layout) {
    EXPECT_EQ(api.layout_destroy(layout), CUBLAS_STATUS_SUCCESS);
  }
}

}  // namespace
}  // namespace troupe::cuda
