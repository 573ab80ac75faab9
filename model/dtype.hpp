#pragma once
// Element types of weights (and, on CUDA, activations; on every backend, the KV cache).
//
// A type is data: how many elements a block holds and how many bytes it takes, registered once
// in dtype_traits_of(). Quantized types store rows as runs of whole blocks, exactly as GGUF
// (ggml) lays them out, so a file's bytes are used in place; the block layouts and their
// reference dequantization are in model/quant/.
// The functions are `static`: SIMD files compiled with -mavx2/-mavx512f include this too, and
// their copies must never be the ones a portable caller links against (as in half_float.hpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

// The first four values travel in KV-transfer headers (kv_span_header::element) and must keep
// their numbers; new types are appended.
enum class dtype : uint8_t {
  f32,
  f16,
  bf16,
  q8_0,           // blocks of 32: f16 scale, 32 int8
  q4_0,           // blocks of 32: f16 scale, 16 bytes of 4-bit values (offset 8)
  q4_1,           // blocks of 32: f16 scale, f16 min, 16 bytes of 4-bit values
  q5_0,           // blocks of 32: f16 scale, 32 high bits, 16 bytes of low nibbles (offset 16)
  q5_1,           // blocks of 32: f16 scale, f16 min, 32 high bits, 16 bytes of low nibbles
  q2_k,           // super-blocks of 256: 16 sub-blocks of 16 with 4-bit scale and min, 2-bit values
  q3_k,           // super-blocks of 256: 16 sub-blocks of 16 with 6-bit scales, 3-bit values
  q4_k,           // super-blocks of 256: 8 sub-blocks of 32 with 6-bit scale and min, 4-bit values
  q5_k,           // super-blocks of 256: 8 sub-blocks of 32 with 6-bit scale and min, 5-bit values
  q6_k,           // super-blocks of 256: 16 sub-blocks of 16 with int8 scales, 6-bit values
  iq4_nl,         // blocks of 32: f16 scale, 4-bit indices into a non-linear table of 16 values
  iq4_xs,         // super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales, iq4_nl's table
  mxfp4,          // blocks of 32: an E8M0 exponent, 4-bit E2M1 values (OCP microscaling)
  fp8_e4m3,       // one byte per element, E4M3FN; a checkpoint's per-row scales ride in weight_tensor
  fp8_e4m3_b128,  // blocks of 128: an f32 scale, 128 E4M3FN values (block-wise scaled FP8 checkpoints)
};

inline constexpr int num_dtypes = static_cast<int>(dtype::fp8_e4m3_b128) + 1;

struct dtype_traits {
  std::string_view name;  // as users write it: "q4_k", "iq4_xs", "f16"
  int64_t block_size;     // elements per block (1 for plain types)
  size_t block_bytes;     // bytes per block
  bool quantized;         // needs a block-wise dequantization (not a plain per-element number)
};

inline constexpr std::array<dtype_traits, num_dtypes> all_dtype_traits = {{
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"q8_0", 32, 34, true},
    {"q4_0", 32, 18, true},
    {"q4_1", 32, 20, true},
    {"q5_0", 32, 22, true},
    {"q5_1", 32, 24, true},
    {"q2_k", 256, 84, true},
    {"q3_k", 256, 110, true},
    {"q4_k", 256, 144, true},
    {"q5_k", 256, 176, true},
    {"q6_k", 256, 210, true},
    {"iq4_nl", 32, 18, true},
    {"iq4_xs", 256, 136, true},
    {"mxfp4", 32, 17, true},
    {"fp8_e4m3", 1, 1, false},
    {"fp8_e4m3_b128", 128, 132, true},
}};

static constexpr const dtype_traits& dtype_traits_of(dtype type) { return all_dtype_traits[static_cast<size_t>(type)]; }

static constexpr std::string_view dtype_name(dtype type) { return dtype_traits_of(type).name; }
static constexpr int64_t dtype_block_size(dtype type) { return dtype_traits_of(type).block_size; }
static constexpr bool is_quantized(dtype type) { return dtype_traits_of(type).quantized; }

// The type named `name` ("q4_k", "Q4_K" and "q4_K" alike), if any.
static inline std::optional<dtype> dtype_from_name(std::string_view name) {
  for (int i = 0; i < num_dtypes; ++i) {
    const std::string_view known = all_dtype_traits[i].name;
    if (known.size() != name.size()) continue;
    bool same = true;
    for (size_t c = 0; c < name.size() && same; ++c) {
      char lower = name[c] >= 'A' && name[c] <= 'Z' ? static_cast<char>(name[c] - 'A' + 'a') : name[c];
      same = lower == known[c];
    }
    if (same) return static_cast<dtype>(i);
  }
  return std::nullopt;
}

inline constexpr int64_t q8_0_block_size = 32;
inline constexpr int64_t q8_0_block_bytes = 34;

// Bytes taken by `num_elements` values (a quantized row must be a whole number of blocks:
// callers check with dtype_block_size first).
static constexpr size_t row_bytes(dtype type, int64_t num_elements) {
  const dtype_traits& t = dtype_traits_of(type);
  return static_cast<size_t>(num_elements / t.block_size) * t.block_bytes;
}

}  // namespace troupe
