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
  dtype element = dtype::f32;  // f32, f16 or bf16
};

// Elements in one block of one side of one layer: block_size * num_kv_heads * head_dim.
// Both throw std::invalid_argument naming the field for a negative (or zero, where it must not
// be) field, an element type other than f32/f16/bf16, or a size that does not fit in size_t.
size_t kv_block_elements(const kv_span_header& header);
size_t kv_span_bytes(const kv_span_header& header);

// The header of the span a model with `config` and pool `pool` exports for `num_blocks` blocks.
kv_span_header kv_span_for(const model_config& config, const kv_cache_shape& pool, int num_blocks, int first_layer,
                           int num_layers, dtype element);

// Everything an export or import checks before touching memory: the header's geometry equals the
// model's (num_kv_heads, head_dim, block_size), its layer range lies inside the model, its element
// type is f32/f16/bf16, num_blocks == block_ids.size(), every id lies in the pool (and, for an
// import, none repeats: two copies into one block would silently keep the last), and data_bytes
// equals kv_span_bytes(header). Throws std::invalid_argument naming the first field that is wrong.
enum class kv_transfer_direction { export_from_pool, import_into_pool };
void check_kv_transfer(const model_config& config, const kv_cache_shape& pool, std::span<const int32_t> block_ids,
                       const kv_span_header& header, size_t data_bytes, kv_transfer_direction direction);

// Host-side conversion of `count` elements between f32, f16 and bf16 (round to nearest even);
// a plain copy when the types are equal.
void convert_kv_elements(dtype from, const std::byte* in, dtype to, std::byte* out, size_t count);

// Bytes of one element of f32, f16 or bf16.
size_t kv_element_bytes(dtype element);

}  // namespace troupe
