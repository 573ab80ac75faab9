#pragma once
// GGUF's on-disk enumerations and the metadata value shared by the reader and the writer.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/dtype.hpp"

namespace troupe {

inline constexpr uint32_t gguf_magic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint64_t gguf_default_alignment = 32;

enum class gguf_value_type : uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

// ggml tensor type ids Troupe loads (the numbers are ggml's, as GGUF stores them).
enum class gguf_tensor_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  iq4_nl = 20,
  iq4_xs = 23,
  bf16 = 30,
  mxfp4 = 39,
};

// ggml's name of any type id it has defined ("Q4_K", "IQ2_XXS"), loadable or not, so a refusal
// can say what the file holds; "type N" for ids ggml never had.
std::string ggml_type_name(uint32_t type);

// A metadata value: `value` holds the number, bool, string, or (possibly nested) array of them.
struct gguf_value {
  gguf_value_type type = gguf_value_type::uint32;
  gguf_value_type element_type = gguf_value_type::uint8;  // arrays only
  nlohmann::json value;

  static gguf_value u32(uint32_t v) { return {gguf_value_type::uint32, gguf_value_type::uint8, v}; }
  static gguf_value i32(int32_t v) { return {gguf_value_type::int32, gguf_value_type::uint8, v}; }
  static gguf_value u64(uint64_t v) { return {gguf_value_type::uint64, gguf_value_type::uint8, v}; }
  static gguf_value f32(float v) { return {gguf_value_type::float32, gguf_value_type::uint8, v}; }
  static gguf_value boolean(bool v) { return {gguf_value_type::boolean, gguf_value_type::uint8, v}; }
  static gguf_value string(std::string v) { return {gguf_value_type::string, gguf_value_type::uint8, std::move(v)}; }
  static gguf_value array(gguf_value_type element, nlohmann::json values) {
    return {gguf_value_type::array, element, std::move(values)};
  }
};

// The dtype of a ggml type id, when Troupe loads it.
std::optional<dtype> dtype_of(uint32_t ggml_type);
// The ggml type id of a dtype; throws std::runtime_error for a type GGUF cannot hold (fp8_e4m3).
gguf_tensor_type gguf_type_of(dtype type);
// "F32, F16, BF16, Q8_0, ...": the ggml names of every type Troupe loads, for error messages.
std::string loadable_ggml_type_names();

}  // namespace troupe
