#pragma once
// One entry point for every model source: an HF directory, a GGUF file, or random weights of
// a config's shape. The result always has canonical HF tensor names and layouts.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "model/dtype.hpp"
#include "model/layer_range.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

enum class load_format { auto_detect, safetensors, gguf, dummy };

struct load_options {
  std::filesystem::path path;  // HF directory or .gguf file; for dummy an HF directory or config.json
  load_format format = load_format::auto_detect;
  dtype dummy_dtype = dtype::f32;
  uint64_t dummy_seed = 0;
  bool show_progress = true;  // drawn only on a terminal or for big models
  // A pipeline stage's layers (model/layer_range.hpp); the default is every layer. The store then
  // keeps only that stage's tensors, and only those are scanned and read into memory.
  layer_range layers;
  // The most bytes the weights this process keeps (its stage's) may take; 0: no bound. More is
  // refused before they are read, naming the bytes needed (`--memory-budget-mb`).
  uint64_t max_weight_bytes = 0;
  std::string budget_note;  // how the bound came about, for that refusal
};

struct loaded_model {
  model_config config;
  weight_store weights;
  std::filesystem::path source;
  // How its weights are quantized, as people name it: a GGUF's general.file_type preset
  // ("Q4_K_M"), else the type holding most weight bytes ("bf16"). See model/quantization_label.hpp.
  std::string quantization;
};

// Throws std::runtime_error naming the path and the problem (missing files, bad headers,
// unsupported architecture or dtype, "tensor X has shape [a,b], expected [c,d] from config.json").
loaded_model load_model(const load_options& options);

// The format of the model at `path`: safetensors for an HF directory, gguf for a .gguf file.
// Throws naming the path when it is missing or neither.
load_format detect_format(const std::filesystem::path& path);

// "auto", "safetensors", "gguf", "dummy" (throws naming the bad value).
load_format parse_load_format(std::string_view name);

}  // namespace troupe
