#pragma once
// llama.cpp's own quantization library (libggml-base.so from node-llama-cpp's prebuilt binaries,
// installed with the npm oracles) as an independent reference for the GGUF block formats: its
// quantizer writes blocks, its dequantizer reads them. Loaded with dlopen at test time; nothing
// of it is linked into Troupe.

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::testing {

class ggml_oracle {
 public:
  // The library under `oracle_dir` (tests/oracles); throws std::runtime_error when it is missing.
  static const ggml_oracle& instance() {
    static const ggml_oracle oracle(library_path());
    return oracle;
  }

  static std::filesystem::path library_path() {
    return std::filesystem::path(TROUPE_ORACLE_DIR) /
           "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
  }
  static bool available() { return std::filesystem::exists(library_path()); }

  // ggml's quantizer: `rows` rows of `per_row` floats into blocks of ggml type id `ggml_type`
  // (with an importance matrix of per_row weights, or none).
  std::vector<std::byte> quantize(uint32_t ggml_type, const float* values, int64_t rows, int64_t per_row,
                                  size_t bytes_per_row, const float* importance = nullptr) const {
    std::vector<std::byte> out(bytes_per_row * static_cast<size_t>(rows));
    const size_t written =
        quantize_chunk_(static_cast<int>(ggml_type), values, out.data(), 0, rows, per_row, importance);
    if (written != out.size()) {
      throw std::runtime_error("ggml_quantize_chunk wrote " + std::to_string(written) + " bytes, expected " +
                               std::to_string(out.size()));
    }
    return out;
  }

  // ggml's dequantizer for `name` as its symbol spells it ("q4_0", "q4_K", "iq4_xs", "mxfp4").
  std::vector<float> dequantize(const std::string& name, const std::byte* blocks, int64_t count) const {
    using dequantize_fn = void (*)(const void*, float*, int64_t);
    auto fn = reinterpret_cast<dequantize_fn>(symbol("dequantize_row_" + name));
    std::vector<float> out(static_cast<size_t>(count));
    fn(blocks, out.data(), count);
    return out;
  }

 private:
  using quantize_chunk_fn = size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*);

  explicit ggml_oracle(const std::filesystem::path& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error("cannot load the ggml oracle " + path.string() + ": " + dlerror());
    quantize_chunk_ = reinterpret_cast<quantize_chunk_fn>(symbol("ggml_quantize_chunk"));
  }

  void* symbol(const std::string& name) const {
    void* fn = dlsym(handle_, name.c_str());
    if (!fn) throw std::runtime_error("the ggml oracle has no symbol " + name);
    return fn;
  }

  void* handle_ = nullptr;  // kept open for the process's life
  quantize_chunk_fn quantize_chunk_ = nullptr;
};

}  // namespace troupe::testing
