#pragma once
// How a model's quantization is named to people: the per-type tensor counts logged at load
// ("q4_K: 97, q6_K: 33, f32: 65", as llama.cpp counts them) and the one label shown by
// /v1/models and `troupe scale --list` (the preset a GGUF's general.file_type names, else the
// type most of the weight bytes hold).

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "model/dtype.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// ggml's spelling, as llama.cpp logs it: "q4_K", "iq4_xs", "f16".
std::string ggml_style_name(dtype type);

// How many tensors of each type the store holds.
std::map<dtype, int> tensor_type_counts(const weight_store& weights);
// "q4_K: 97, q6_K: 33, f32: 65": most first, ties by type.
std::string describe_type_counts(const std::map<dtype, int>& counts);

// The preset name of a GGUF general.file_type llama-quantize writes ("Q4_K_M"), if known.
std::optional<std::string> file_type_label(uint32_t file_type);
// The label of a loaded model: `file_type`'s preset when known, else the type holding the most
// weight bytes ("q8_0", "bf16").
std::string quantization_label(const weight_store& weights, std::optional<uint32_t> file_type);

}  // namespace troupe
