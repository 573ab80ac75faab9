#pragma once
// cuBLASLt, loaded when the first CUDA model needs it rather than when the process starts.
// libcublasLt is large, and linking it made every `troupe` process pay for it at start (about
// 62 MiB of resident pages from the loader's relocations, measured on a CPU-only serve), although
// only a model on a GPU calls it. The entry points Troupe uses are resolved once, by their own
// declared types, so a mismatch with the header does not compile.

#include <cublasLt.h>

namespace troupe::cuda {

struct cublaslt_api {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) desc_create;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy;
};

// The library's entry points, loaded on the first call (thread-safe; later calls take no lock,
// so a matmul may call it each time); throws cuda_error naming
// each file it tried and why (dlerror) when none loads or a symbol is missing.
const cublaslt_api& cublaslt();

// Whether this process has loaded cuBLASLt yet (a CPU-only run never should).
bool cublaslt_loaded();

}  // namespace troupe::cuda
