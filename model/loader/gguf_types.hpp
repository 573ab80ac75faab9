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
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6,
  boolean = 7, string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12,
};

// ggml tensor types Troupe maps (others are listed but not loadable).
enum class gguf_tensor_type : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

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

inline std::optional<dtype> dtype_of(gguf_tensor_type type) {
  switch (type) {
    case gguf_tensor_type::f32: return dtype::f32;
    case gguf_tensor_type::f16: return dtype::f16;
    case gguf_tensor_type::q8_0: return dtype::q8_0;
    case gguf_tensor_type::bf16: return dtype::bf16;
  }
  return std::nullopt;
}

inline gguf_tensor_type gguf_type_of(dtype type) {
  switch (type) {
    case dtype::f32: return gguf_tensor_type::f32;
    case dtype::f16: return gguf_tensor_type::f16;
    case dtype::bf16: return gguf_tensor_type::bf16;
    case dtype::q8_0: return gguf_tensor_type::q8_0;
  }
  return gguf_tensor_type::f32;
}

}  // namespace troupe
