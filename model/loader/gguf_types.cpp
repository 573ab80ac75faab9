#include "model/loader/gguf_types.hpp"

#include <array>
#include <stdexcept>
#include <utility>

namespace troupe {
namespace {

// Every type id ggml has defined (ids 4, 5, 31-33 and 36-38 were removed from GGUF files).
constexpr std::array<std::pair<uint32_t, const char*>, 35> ggml_names = {{
    {0, "F32"},      {1, "F16"},     {2, "Q4_0"},     {3, "Q4_1"},   {6, "Q5_0"},    {7, "Q5_1"},   {8, "Q8_0"},
    {9, "Q8_1"},     {10, "Q2_K"},   {11, "Q3_K"},    {12, "Q4_K"},  {13, "Q5_K"},   {14, "Q6_K"},  {15, "Q8_K"},
    {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"}, {22, "IQ2_S"},
    {23, "IQ4_XS"},  {24, "I8"},     {25, "I16"},     {26, "I32"},   {27, "I64"},    {28, "F64"},   {29, "IQ1_M"},
    {30, "BF16"},    {34, "TQ1_0"},  {35, "TQ2_0"},   {39, "MXFP4"}, {40, "NVFP4"},  {41, "Q1_0"},  {42, "Q2_0"},
}};

constexpr std::array<std::pair<gguf_tensor_type, dtype>, 16> loadable = {{
    {gguf_tensor_type::f32, dtype::f32},
    {gguf_tensor_type::f16, dtype::f16},
    {gguf_tensor_type::bf16, dtype::bf16},
    {gguf_tensor_type::q8_0, dtype::q8_0},
    {gguf_tensor_type::q4_0, dtype::q4_0},
    {gguf_tensor_type::q4_1, dtype::q4_1},
    {gguf_tensor_type::q5_0, dtype::q5_0},
    {gguf_tensor_type::q5_1, dtype::q5_1},
    {gguf_tensor_type::q2_k, dtype::q2_k},
    {gguf_tensor_type::q3_k, dtype::q3_k},
    {gguf_tensor_type::q4_k, dtype::q4_k},
    {gguf_tensor_type::q5_k, dtype::q5_k},
    {gguf_tensor_type::q6_k, dtype::q6_k},
    {gguf_tensor_type::iq4_nl, dtype::iq4_nl},
    {gguf_tensor_type::iq4_xs, dtype::iq4_xs},
    {gguf_tensor_type::mxfp4, dtype::mxfp4},
}};

}  // namespace

std::string ggml_type_name(uint32_t type) {
  for (const auto& [id, name] : ggml_names) {
    if (id == type) return name;
  }
  return "type " + std::to_string(type);
}

std::optional<dtype> dtype_of(uint32_t ggml_type) {
  for (const auto& [id, type] : loadable) {
    if (static_cast<uint32_t>(id) == ggml_type) return type;
  }
  return std::nullopt;
}

gguf_tensor_type gguf_type_of(dtype type) {
  for (const auto& [id, known] : loadable) {
    if (known == type) return id;
  }
  throw std::runtime_error("GGUF has no tensor type for " + std::string(dtype_name(type)));
}

std::string loadable_ggml_type_names() {
  std::string names;
  for (const auto& [id, type] : loadable)
    names += (names.empty() ? "" : ", ") + ggml_type_name(static_cast<uint32_t>(id));
  return names;
}

}  // namespace troupe
