#pragma once
// The metadata llama.cpp reads for a model's shape (general.architecture and the
// "<arch>.*" hyper-parameters), written from a model_config: the HF → GGUF side of
// gguf_model_config(). The tokenizer's keys are add_tokenizer_metadata's.

#include <string>

#include "model/loader/gguf_writer.hpp"
#include "model/model_config.hpp"

namespace troupe {

// llama.cpp's name of the config's architecture ("llama" for Llama and Mistral, "qwen2", "qwen3").
std::string gguf_architecture_name(const model_config& config);

// Whether GGUF stores q/k projection rows of this architecture in the interleaved RoPE layout
// (rope_permutation.hpp): llama.cpp's "llama" does.
bool gguf_permutes_qk(const model_config& config);

// Sets general.architecture, general.name and every hyper-parameter key llama.cpp needs.
void add_model_metadata(gguf_writer& writer, const model_config& config, const std::string& name);

}  // namespace troupe
