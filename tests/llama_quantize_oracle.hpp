#pragma once
// llama.cpp's own model quantizer (llama_model_quantize in libllama from node-llama-cpp's
// prebuilt binaries, installed with the npm oracles) as an independent reference for the
// per-tensor choice of types of each preset: quantize the same F32 GGUF file with it, then read
// the types it wrote. Loaded with dlopen at test time; nothing of it is linked into Troupe.

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::testing {

class llama_quantize_oracle {
 public:
  static const llama_quantize_oracle& instance() {
    static const llama_quantize_oracle oracle(library_path());
    return oracle;
  }

  static std::filesystem::path library_path() {
    return std::filesystem::path(TROUPE_ORACLE_DIR) /
           "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so";
  }
  static bool available() { return std::filesystem::exists(library_path()); }

  // Quantizes `input` into `output` as `llama-quantize [--pure] input output FTYPE 1` would,
  // with `importance` (GGUF tensor name -> values) as its imatrix when not empty. Throws on
  // failure.
  void quantize(const std::filesystem::path& input, const std::filesystem::path& output, uint32_t file_type,
                const std::map<std::string, std::vector<float>>& importance = {}, bool pure = false) const {
    params p = default_params_();
    p.nthread = 1;
    p.ftype = static_cast<int32_t>(file_type);
    p.pure = pure;
    std::vector<importance_entry> entries;
    for (const auto& [name, values] : importance) entries.push_back({name.c_str(), values.data(), values.size()});
    entries.push_back({nullptr, nullptr, 0});
    if (!importance.empty()) p.imatrix = entries.data();
    if (quantize_(input.c_str(), output.c_str(), &p) != 0) {
      throw std::runtime_error("llama_model_quantize failed for " + input.string() + " -> file type " +
                               std::to_string(file_type));
    }
  }

 private:
  // The ABI of llama.h's llama_model_quantize_params and llama_model_imatrix_data in the
  // llama.cpp release node-llama-cpp ships (v0.5.0 bins); enums are 32-bit ints.
  struct params {
    int32_t nthread;
    int32_t ftype;
    int32_t output_tensor_type;
    int32_t token_embedding_type;
    bool allow_requantize;
    bool quantize_output_tensor;
    bool only_copy;
    bool pure;
    bool keep_split;
    bool dry_run;
    const void* imatrix;
    const void* kv_overrides;
    const void* tt_overrides;
    const int32_t* prune_layers;
    size_t max_buf_size;
  };
  struct importance_entry {
    const char* name;
    const float* data;
    size_t size;
  };
  using default_params_fn = params (*)();
  using quantize_fn = uint32_t (*)(const char*, const char*, const params*);

  explicit llama_quantize_oracle(const std::filesystem::path& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error("cannot load the llama.cpp oracle " + path.string() + ": " + dlerror());
    default_params_ = reinterpret_cast<default_params_fn>(symbol("llama_model_quantize_default_params"));
    quantize_ = reinterpret_cast<quantize_fn>(symbol("llama_model_quantize"));
    reinterpret_cast<void (*)()>(symbol("llama_backend_init"))();
    // Quiet: its log goes to stderr line by line otherwise.
    using log_callback = void (*)(int, const char*, void*);
    reinterpret_cast<void (*)(log_callback, void*)>(symbol("llama_log_set"))([](int, const char*, void*) {}, nullptr);
  }

  void* symbol(const char* name) const {
    void* fn = dlsym(handle_, name);
    if (!fn) throw std::runtime_error(std::string("the llama.cpp oracle has no symbol ") + name);
    return fn;
  }

  void* handle_ = nullptr;  // kept open for the process's life
  default_params_fn default_params_ = nullptr;
  quantize_fn quantize_ = nullptr;
};

}  // namespace troupe::testing
