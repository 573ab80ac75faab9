#pragma once
// Element types of weights (and, on CUDA, activations).

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe {

enum class dtype : uint8_t {
  f32,
  f16,
  bf16,
  q8_0,  // GGUF Q8_0: blocks of 32 int8 with one f16 scale (34 bytes a block)
};

inline constexpr int64_t q8_0_block_size = 32;
inline constexpr int64_t q8_0_block_bytes = 34;

inline std::string_view dtype_name(dtype type) {
  switch (type) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::q8_0: return "q8_0";
  }
  return "unknown";
}

// Bytes taken by one row of `num_elements` values (a Q8_0 row must be a whole number of blocks).
inline size_t row_bytes(dtype type, int64_t num_elements) {
  switch (type) {
    case dtype::f32: return static_cast<size_t>(num_elements) * 4;
    case dtype::f16:
    case dtype::bf16: return static_cast<size_t>(num_elements) * 2;
    case dtype::q8_0: return static_cast<size_t>(num_elements / q8_0_block_size * q8_0_block_bytes);
  }
  return 0;
}

}  // namespace troupe
