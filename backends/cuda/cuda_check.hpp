#pragma once
// Turns CUDA and cuBLAS status codes into exceptions that say which call failed and why.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::cuda {

class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw cuda_error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorName(status) + " (" +
                     cudaGetErrorString(status) + ")");
  }
}

inline void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw cuda_error(std::string("cuBLAS: ") + what + " failed with status " +
                     std::to_string(static_cast<int>(status)));
  }
}

// After a kernel launch: a bad configuration shows up here, not at the launch itself.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace troupe::cuda
