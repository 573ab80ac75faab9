// Quantizes a GGUF file with llama.cpp's own quantizer (llama_model_quantize in node-llama-cpp's
// prebuilt libllama, the npm oracles' copy, loaded with dlopen), so the speed benchmarks run
// Troupe and llama.cpp on the very files llama.cpp users make: the same per-tensor mix of types
// for the presets (Q4_K_M, Q3_K_M, ...) as `llama-quantize` writes.
//
//   troupe_bench_llama_quantize IN.gguf OUT.gguf TYPE [--threads N]
//     TYPE: q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k
//           iq4_nl iq4_xs f16 bf16

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// llama_ftype values (llama.h).
const std::vector<std::pair<std::string, int>> ftypes = {
    {"f16", 1},     {"q4_0", 2},    {"q4_1", 3},    {"q8_0", 7},    {"q5_0", 8},    {"q5_1", 9},
    {"q2_k", 10},   {"q3_k_s", 11}, {"q3_k_m", 12}, {"q3_k_l", 13}, {"q4_k_s", 14}, {"q4_k_m", 15},
    {"q5_k_s", 16}, {"q5_k_m", 17}, {"q6_k", 18},   {"iq4_nl", 25}, {"iq4_xs", 30}, {"bf16", 32},
};

std::filesystem::path libllama() {
  const std::filesystem::path dir =
      std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/oracles/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("libllama.", 0) == 0 && name.find(".so") != std::string::npos) return entry.path();
    }
  }
  throw std::runtime_error("no libllama*.so under " + dir.string() + " (are the npm oracles installed?)");
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) throw std::runtime_error("usage: troupe_bench_llama_quantize IN.gguf OUT.gguf TYPE [--threads N]");
  const std::string in = argv[1], out = argv[2], type = argv[3];
  int threads = 0;
  if (argc >= 6 && std::string(argv[4]) == "--threads") threads = std::stoi(argv[5]);
  int ftype = -1;
  for (const auto& [name, value] : ftypes)
    if (name == type) ftype = value;
  if (ftype < 0) throw std::runtime_error("unknown type '" + type + "'");

  void* lib = dlopen(libllama().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(std::string("dlopen: ") + dlerror());
  auto backend_init = reinterpret_cast<void (*)()>(dlsym(lib, "llama_backend_init"));
  // The params struct is returned through a hidden pointer (it is far larger than two registers),
  // so a buffer at least as large as llama.cpp's struct receives it whole; only its first two
  // fields, nthread (int32) and ftype (enum), are set here, as llama.h has laid them out for years.
  struct params_buffer {
    alignas(16) unsigned char bytes[1024];
  };
  auto default_params = reinterpret_cast<params_buffer (*)()>(dlsym(lib, "llama_model_quantize_default_params"));
  auto quantize =
      reinterpret_cast<uint32_t (*)(const char*, const char*, const void*)>(dlsym(lib, "llama_model_quantize"));
  if (!default_params || !quantize) throw std::runtime_error("libllama lacks llama_model_quantize");
  if (backend_init) backend_init();
  params_buffer params = default_params();
  const int32_t nthread = threads;
  const int32_t ftype_value = ftype;
  std::memcpy(params.bytes, &nthread, 4);
  std::memcpy(params.bytes + 4, &ftype_value, 4);
  if (quantize(in.c_str(), out.c_str(), params.bytes) != 0) throw std::runtime_error("llama_model_quantize failed");
  std::printf("wrote %s (%s, %.1f MiB)\n", out.c_str(), type.c_str(), std::filesystem::file_size(out) / 1048576.0);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_llama_quantize: %s\n", e.what());
  return 1;
}
