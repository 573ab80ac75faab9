#include "backends/cuda/cublaslt_library.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

namespace {

// Set once the table is filled; every matmul reads it, so the steady state takes no lock.
std::atomic<bool> ready{false};
cublaslt_api api{};
std::mutex loading;

// The build's own copy first (its toolkit), then the runtime's search path by soname.
std::vector<std::string> candidates() {
  return {TROUPE_CUBLASLT_PATH, "libcublasLt.so." TROUPE_CUDA_MAJOR, "libcublasLt.so"};
}

template <class F>
void resolve(void* library, const char* name, F& slot, const std::string& file) {
  void* symbol = dlsym(library, name);
  if (!symbol) throw cuda_error("cuBLASLt: " + file + " has no " + name + ": " + dlerror());
  slot = reinterpret_cast<F>(symbol);
}

cublaslt_api load() {
  std::string tried;
  void* library = nullptr;
  std::string file;
  for (const std::string& candidate : candidates()) {
    library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library) {
      file = candidate;
      break;
    }
    tried += "\n  " + candidate + ": " + dlerror();
  }
  if (!library) throw cuda_error("cuBLASLt: cannot load the library; tried:" + tried);
  cublaslt_api table{};
  resolve(library, "cublasLtCreate", table.create, file);
  resolve(library, "cublasLtDestroy", table.destroy, file);
  resolve(library, "cublasLtMatmul", table.matmul, file);
  resolve(library, "cublasLtMatmulAlgoGetHeuristic", table.algo_get_heuristic, file);
  resolve(library, "cublasLtMatmulDescCreate", table.desc_create, file);
  resolve(library, "cublasLtMatmulDescDestroy", table.desc_destroy, file);
  resolve(library, "cublasLtMatmulDescSetAttribute", table.desc_set_attribute, file);
  resolve(library, "cublasLtMatmulPreferenceCreate", table.preference_create, file);
  resolve(library, "cublasLtMatmulPreferenceDestroy", table.preference_destroy, file);
  resolve(library, "cublasLtMatmulPreferenceSetAttribute", table.preference_set_attribute, file);
  resolve(library, "cublasLtMatrixLayoutCreate", table.layout_create, file);
  resolve(library, "cublasLtMatrixLayoutDestroy", table.layout_destroy, file);
  // Never closed: handles and plans made from it live as long as the models that use them.
  return table;
}

}  // namespace

const cublaslt_api& cublaslt() {
  if (ready.load(std::memory_order_acquire)) return api;
  // A failed load is tried again by the next model rather than remembered as a static's exception.
  std::lock_guard lock(loading);
  if (!ready.load(std::memory_order_relaxed)) {
    api = load();
    ready.store(true, std::memory_order_release);
  }
  return api;
}

bool cublaslt_loaded() { return ready.load(std::memory_order_acquire); }

}  // namespace troupe::cuda
