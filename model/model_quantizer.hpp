#pragma once
// Quantizes a whole model into one GGUF file: the logic of `troupe quantize IN OUT --type TYPE`.
//
// IN is an HF directory (safetensors in F32/F16/BF16) or an F32/F16/BF16 GGUF file; OUT gets
// every tensor in the type the preset gives it (model/quant/quantize_presets.hpp: llama.cpp's
// mixes, with its fallbacks where rows do not fit a type's blocks), the input's metadata (from a
// GGUF: every key, the tokenizer's included; from HF: the hyper-parameters and tokenizer
// llama.cpp needs), general.file_type and general.quantization_version as llama-quantize sets
// them. An importance matrix (llama.cpp's imatrix, GGUF or legacy .dat) weighs each column's
// error. Rows are quantized on several threads, one tensor at a time, and the output is written
// as it is produced: memory holds the mapped input and one output tensor.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/quant/quantize_presets.hpp"

namespace troupe {

struct importance_matrix;

struct quantize_options {
  std::filesystem::path input;       // HF directory or .gguf
  std::filesystem::path output;      // .gguf to write (replaced)
  std::string type = "Q4_K_M";       // a preset (quant::preset_names()) or MXFP4
  bool pure = false;                 // every matrix in the preset's base type, no per-tensor mix
  std::filesystem::path importance;  // imatrix file; empty: none
  int num_threads = 0;               // 0: every core
  bool show_progress = true;         // a bar on a terminal
};

// One output tensor and the type chosen for it.
struct planned_tensor {
  std::string name;           // GGUF name
  std::vector<int64_t> dims;  // innermost first, as GGUF stores them
  dtype from = dtype::f32;    // the input's type
  dtype to = dtype::f32;      // the output's type
  bool fell_back = false;     // the preset's type did not fit its rows
  bool weighted = false;      // an importance entry weighs its columns
};

struct quantize_result {
  uint64_t input_bytes = 0;   // tensor bytes read
  uint64_t output_bytes = 0;  // tensor bytes written
  std::map<dtype, int> tensors_per_type;
};

class model_quantizer {
 public:
  // Opens the input and the importance matrix and plans every tensor's type. Throws
  // std::runtime_error naming the bad input: an unknown type, an unreadable model, a tensor
  // that is already quantized (requantizing loses quality and is not offered), an importance
  // entry of the wrong size.
  explicit model_quantizer(quantize_options options);
  ~model_quantizer();
  model_quantizer(const model_quantizer&) = delete;
  model_quantizer& operator=(const model_quantizer&) = delete;

  const quant::quantize_preset& preset() const { return preset_; }
  const std::vector<planned_tensor>& plan() const { return plan_; }

  // Quantizes and writes options.output (through a temporary file renamed at the end, so a
  // failure leaves no half-written model). Throws naming the tensor and row of a non-finite
  // value.
  quantize_result run();

 private:
  struct source;        // the input's tensors and metadata (GGUF or HF)
  struct input_tensor;  // one of them, rows in GGUF layout

  // Converts `in` to planned.to into `out`, rows spread over threads.
  void quantize_tensor(const input_tensor& in, const planned_tensor& planned, const float* importance, int num_threads,
                       std::byte* out) const;

  quantize_options options_;
  quant::quantize_preset preset_{};
  std::unique_ptr<source> source_;
  std::vector<planned_tensor> plan_;
  const importance_matrix* importance_ = nullptr;  // owned by source_
};

}  // namespace troupe
