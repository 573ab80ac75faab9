#pragma once
// Linear layers through cuBLASLt: y = x W^T (+ bias), f32 accumulation.
//
// Weights are row-major [out_features, in_features] as in HF files, which cuBLAS (column-major)
// sees as W^T of shape [in, out]: y^T [out, tokens] = op(W)[out, in] x^T [in, tokens] with
// op = transpose. f32 inputs use CUBLAS_COMPUTE_32F without TF32, so f32 results match a CPU
// reference to rounding. Algorithm choice is cached per shape, so steady-state calls (and CUDA
// graph capture) do no heuristic queries.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backends/cuda/device_buffer.hpp"
#include "model/dtype.hpp"

namespace troupe::cuda {

class matmul {
 public:
  matmul();
  ~matmul();
  matmul(const matmul&) = delete;
  matmul& operator=(const matmul&) = delete;

  // x [tokens, in] of `in_type`; weight [out, in] of `in_type`; bias [out] of `out_type` or null;
  // y [tokens, ldy] of `out_type` (ldy 0: out) (f32 out with 16-bit in is allowed: logits).
  void run(const void* x, const void* weight, const void* bias, void* y, int tokens, int in_features, int out_features,
           dtype in_type, dtype out_type, cudaStream_t stream, int64_t ldy = 0);

 private:
  struct plan;
  // tokens, in, out, in type, out type, bias, ldy, alignment of the weight, x and y
  using key = std::tuple<int, int, int, int, int, bool, int64_t, uint32_t, uint32_t, uint32_t>;
  plan& plan_for(const key& k);

  cublasLtHandle_t handle_ = nullptr;
  device_buffer workspace_;  // [workspace_bytes]
  std::map<key, plan*> plans_;
};

}  // namespace troupe::cuda
