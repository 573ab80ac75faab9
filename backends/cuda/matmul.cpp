#include "backends/cuda/matmul.hpp"

#include <memory>
#include <string>
#include <utility>

#include "backends/cuda/cublaslt_library.hpp"
#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

namespace {

constexpr size_t workspace_bytes = 32u << 20;

cudaDataType_t cuda_type(dtype type) {
  switch (type) {
    case dtype::f32: return CUDA_R_32F;
    case dtype::f16: return CUDA_R_16F;
    case dtype::bf16: return CUDA_R_16BF;
    default: break;
  }
  throw std::runtime_error("CUDA matmul: dtype " + std::string(dtype_name(type)) +
                           " is not supported (expected f32, f16 or bf16)");
}

// The largest power of two (up to cuBLASLt's default 256) that divides the address.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

struct matmul::plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~plan() {
    if (a) cublaslt().layout_destroy(a);
    if (b) cublaslt().layout_destroy(b);
    if (c) cublaslt().layout_destroy(c);
    if (operation) cublaslt().desc_destroy(operation);
  }
};

matmul::matmul() : workspace_(workspace_bytes) { check(cublaslt().create(&handle_), "cublasLtCreate"); }

matmul::~matmul() {
  for (auto& [k, p] : plans_) delete p;
  if (handle_) cublaslt().destroy(handle_);
}

matmul::plan& matmul::plan_for(const key& k) {
  if (auto it = plans_.find(k); it != plans_.end()) return *it->second;
  const auto [tokens, in_features, out_features, in_index, out_index, bias, ldy, align_w, align_x, align_y] = k;
  const dtype in_type = static_cast<dtype>(in_index), out_type = static_cast<dtype>(out_index);

  auto owned = std::make_unique<plan>();
  plan& p = *owned;
  check(cublaslt().desc_create(&p.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(cublaslt().desc_set_attribute(p.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
        "set TRANSA");
  check(cublaslt().desc_set_attribute(p.operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)), "set TRANSB");
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(cublaslt().desc_set_attribute(p.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
          "set EPILOGUE");
    const cudaDataType_t bias_type = cuda_type(out_type);
    check(
        cublaslt().desc_set_attribute(p.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
        "set BIAS_DATA_TYPE");
  }
  // Column-major views: A = W^T stored [in, out] (ld in), B = x^T [in, tokens], C = y^T [out, tokens] (ld ldy).
  check(cublaslt().layout_create(&p.a, cuda_type(in_type), in_features, out_features, in_features), "layout A");
  check(cublaslt().layout_create(&p.b, cuda_type(in_type), in_features, tokens, in_features), "layout B");
  check(cublaslt().layout_create(&p.c, cuda_type(out_type), out_features, tokens, ldy), "layout C");

  cublasLtMatmulPreference_t preference = nullptr;
  check(cublaslt().preference_create(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t max_workspace = workspace_bytes;
  check(cublaslt().preference_set_attribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                            sizeof(max_workspace)),
        "set MAX_WORKSPACE_BYTES");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y},
  };
  for (const auto& [attribute, bytes] : alignments) {
    check(cublaslt().preference_set_attribute(preference, attribute, &bytes, sizeof(bytes)), "set MIN_ALIGNMENT");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublaslt().algo_get_heuristic(handle_, p.operation, p.a, p.b, p.c, p.c, preference, 1, &result, &found);
  cublaslt().preference_destroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw cuda_error("cuBLASLt has no algorithm for a " + std::string(dtype_name(in_type)) + " matmul of " +
                     std::to_string(tokens) + " tokens x " + std::to_string(in_features) + " -> " +
                     std::to_string(out_features) + " (" + std::string(dtype_name(out_type)) + " out" +
                     (bias ? ", bias" : "") + "), status " + std::to_string(static_cast<int>(status)));
  }
  p.algo = result.algo;
  plans_.emplace(k, owned.get());
  return *owned.release();
}

void matmul::run(const void* x, const void* weight, const void* bias, void* y, int tokens, int in_features,
                 int out_features, dtype in_type, dtype out_type, cudaStream_t stream, int64_t ldy) {
  if (tokens == 0) return;
  if (ldy == 0) ldy = out_features;
  if (ldy < out_features) {
    throw cuda_error("CUDA matmul: output rows " + std::to_string(ldy) + " apart, narrower than the " +
                     std::to_string(out_features) + " outputs");
  }
  plan& p = plan_for(key{tokens, in_features, out_features, static_cast<int>(in_type), static_cast<int>(out_type),
                         bias != nullptr, ldy, alignment_of(weight), alignment_of(x), alignment_of(y)});
  if (bias) {
    check(cublaslt().desc_set_attribute(p.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
          "set BIAS_POINTER");
  }
  const float alpha = 1.0f, beta = 0.0f;
  check(cublaslt().matmul(handle_, p.operation, &alpha, weight, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                          workspace_.get(), workspace_.size(), stream),
        "cublasLtMatmul");
}

}  // namespace troupe::cuda
