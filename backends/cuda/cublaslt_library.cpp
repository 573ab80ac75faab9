#include "backends/cuda/cublaslt_library.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

namespace {

std::atomic<bool> loaded{false};

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
  cublaslt_api api{};
  resolve(library, "cublasLtCreate", api.create, file);
  resolve(library, "cublasLtDestroy", api.destroy, file);
  resolve(library, "cublasLtMatmul", api.matmul, file);
  resolve(library, "cublasLtMatmulAlgoGetHeuristic", api.algo_get_heuristic, file);
  resolve(library, "cublasLtMatmulDescCreate", api.desc_create, file);
  resolve(library, "cublasLtMatmulDescDestroy", api.desc_destroy, file);
  resolve(library, "cublasLtMatmulDescSetAttribute", api.desc_set_attribute, file);
  resolve(library, "cublasLtMatmulPreferenceCreate", api.preference_create, file);
  resolve(library, "cublasLtMatmulPreferenceDestroy", api.preference_destroy, file);
  resolve(library, "cublasLtMatmulPreferenceSetAttribute", api.preference_set_attribute, file);
  resolve(library, "cublasLtMatrixLayoutCreate", api.layout_create, file);
  resolve(library, "cublasLtMatrixLayoutDestroy", api.layout_destroy, file);
  // Never closed: handles and plans made from it live as long as the models that use them.
  loaded = true;
  return api;
}

}  // namespace

const cublaslt_api& cublaslt() {
  // A failed load is tried again by the next model rather than remembered as a static's exception.
  static std::mutex mutex;
  static cublaslt_api api{};
  static bool ready = false;
  std::lock_guard lock(mutex);
  if (!ready) {
    api = load();
    ready = true;
  }
  return api;
}

bool cublaslt_loaded() { return loaded; }

}  // namespace troupe::cuda
