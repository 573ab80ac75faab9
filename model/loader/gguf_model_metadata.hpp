#pragma once
// The metadata llama.cpp reads for a model's shape (general.architecture and the
// "<arch>.*" hyper-parameters), and the tensors that carry rope scaling, written from a
// model_config: the HF → GGUF side of gguf_model_config(). One definition serves the model maker
// and the quantizer. The tokenizer's keys are add_tokenizer_metadata's.

#include <string>
#include <vector>

#include "model/loader/gguf_writer.hpp"
#include "model/model_config.hpp"

namespace troupe {

// llama.cpp's name of the config's architecture ("llama" for Llama and Mistral, "qwen2", "gemma2"...).
std::string gguf_architecture_name(const model_config& config);

// Sets general.architecture, general.name and every hyper-parameter key llama.cpp needs (rope
// scaling, experts, soft-caps, sliding windows included).
void add_model_metadata(gguf_writer& writer, const model_config& config, const std::string& name);

// The F32 tensors some rope scalings are read from: llama3's rope_freqs.weight, longrope's long
// and short factors. Empty for every other model.
struct gguf_extra_tensor {
  std::string name;
  std::vector<float> values;  // [rotary dims / 2]
};
std::vector<gguf_extra_tensor> gguf_rope_tensors(const model_config& config);

}  // namespace troupe
