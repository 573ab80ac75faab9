#pragma once
// A portable span of a request's KV cache, for moving it between two model instances (prefill on
// one, decode on another; issue 11), whatever their backends and KV dtypes.
//
// Byte layout of a span (native byte order, elements of `element`, no padding):
//     for layer in [first_layer, first_layer + num_layers):
//       for side in (K, V):
//         for block in block_ids, in the order given:
//           [block_size, num_kv_heads, head_dim]
// i.e. [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]. Both backends keep each
// layer's K and V pools as [pool_blocks, block_size, num_kv_heads, head_dim], so one block of one
// side of one layer is a single contiguous run in the pool and in the span: a copy per run, no
// gather. Slots of a block past the request's last token are copied as they are (not meaningful).
//
// Element types (the KV cache dtypes, `--kv-cache-dtype`): f32, f16, bf16, fp8_e4m3 (one byte,
// no scale: values beyond +-448 saturate) and q8_0 (GGUF's blocks of 32 elements: an f16 scale
// and 32 int8). A q8_0 block never straddles two heads, so q8_0 needs head_dim % 32 == 0; a run
// of q8_0 is row_bytes(q8_0, elements) bytes.

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/dtype.hpp"
#include "model/model_config.hpp"

namespace troupe {

struct kv_cache_shape;

struct kv_span_header {
  int first_layer = 0;
  int num_layers = 0;
  int num_blocks = 0;  // how many block ids the span carries
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  dtype element = dtype::f32;  // a KV element type (is_kv_element)
};

// True for the types a KV cache and a KV span may hold: f32, f16, bf16, q8_0, fp8_e4m3.
bool is_kv_element(dtype element);

// Throws std::invalid_argument unless `element` is a KV element type that can hold heads of
// `head_dim` (q8_0: a multiple of 32), naming the type, head_dim and what was expected.
void check_kv_element(dtype element, int head_dim);

// Elements in one block of one side of one layer: block_size * num_kv_heads * head_dim.
// Both throw std::invalid_argument naming the field for a negative (or zero, where it must not
// be) field, an element type that is not a KV element (or q8_0 with head_dim % 32 != 0), or a
// size that does not fit in size_t.
size_t kv_block_elements(const kv_span_header& header);
size_t kv_span_bytes(const kv_span_header& header);

// The header of the span a model with `config` and pool `pool` exports for `num_blocks` blocks.
kv_span_header kv_span_for(const model_config& config, const kv_cache_shape& pool, int num_blocks, int first_layer,
                           int num_layers, dtype element);

// Everything an export or import checks before touching memory: the header's geometry equals the
// model's (num_kv_heads, head_dim, block_size), its layer range lies inside the model, its element
// type is a KV element that fits head_dim, num_blocks == block_ids.size(), every id lies in the pool (and, for an
// import, none repeats: two copies into one block would silently keep the last), and data_bytes
// equals kv_span_bytes(header). Throws std::invalid_argument naming the first field that is wrong.
enum class kv_transfer_direction { export_from_pool, import_into_pool };
void check_kv_transfer(const model_config& config, const kv_cache_shape& pool, std::span<const int32_t> block_ids,
                       const kv_span_header& header, size_t data_bytes, kv_transfer_direction direction);

// Host-side conversion of `count` elements between any two KV element types, through f32
// (rounding to nearest even; q8_0 as below); a plain copy when the types are equal. count must
// be a multiple of 32 when either type is q8_0.
void convert_kv_elements(dtype from, const std::byte* in, dtype to, std::byte* out, size_t count);

// The reference encoding of `count` f32 values as a KV element type, and its decoding: what the
// CPU kernels' SIMD versions are checked against. q8_0: per block of 32, d = max|x| / 127,
// q = x / d rounded to nearest even, d stored as f16 (as GGUF's Q8_0; ggml rounds halves away
// from zero, so its bytes can differ in the last step of a value exactly between two).
void kv_encode_f32(dtype element, const float* in, std::byte* out, size_t count);
void kv_decode_f32(dtype element, const std::byte* in, float* out, size_t count);

// Bytes taken by `count` elements of a KV element type (count: whole blocks for q8_0).
size_t kv_bytes(dtype element, size_t count);

}  // namespace troupe
