#pragma once
// The paged KV cache of the CPU backend, in any KV element type (f32, f16, bf16, q8_0,
// fp8_e4m3; model/kv_transfer.hpp): `--kv-cache-dtype`, f16 by default.
//
// Layout: for every layer, one K pool and one V pool, each
//     [num_blocks, block_size, num_kv_heads, head_dim] of the element type
// contiguous and row-major, so a slot (block * block_size + offset) holds all KV heads of one
// token side by side (row_bytes(element, num_kv_heads * head_dim) bytes; a q8_0 block of 32
// never straddles two heads) and a block is one contiguous run of block_size such slots. The
// whole cache is one 64-byte aligned allocation:
//     [num_layers, 2 (K then V), num_blocks, block_size, num_kv_heads, head_dim].

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "model/dtype.hpp"
#include "model/forward_batch.hpp"
#include "model/kv_transfer.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"

namespace troupe::cpu {

class kv_pool {
 public:
  // Throws std::invalid_argument for an element type that is not a KV type or does not fit
  // head_dim (q8_0 needs a multiple of 32), std::runtime_error for an empty shape.
  kv_pool(const model_config& config, kv_cache_shape shape, dtype element);

  kv_cache_shape shape() const { return shape_; }
  dtype element() const { return element_; }
  int64_t num_slots() const { return static_cast<int64_t>(shape_.num_blocks) * shape_.block_size; }
  size_t slot_bytes() const { return slot_bytes_; }  // one token's K (or V), every KV head

  std::byte* keys(int layer) { return data_.get() + layer_offset(layer); }  // [slots, kv_heads, head_dim]
  std::byte* values(int layer) {
    return data_.get() + layer_offset(layer) + pool_bytes_;
  }  // [slots, kv_heads, head_dim]
  const std::byte* keys(int layer) const { return data_.get() + layer_offset(layer); }
  const std::byte* values(int layer) const { return data_.get() + layer_offset(layer) + pool_bytes_; }

  // Writes each new token's K and V (f32 rows of k / v, ld floats apart, num_kv_heads *
  // head_dim used) into its slot of `layer`, converted to the element type. Throws
  // std::runtime_error on a slot outside the pool.
  void write(int layer, const float* k, const float* v, int64_t ld, const int64_t* slot_mapping, int64_t num_tokens);

  // Copies the span `header` describes between blocks `block_ids` of the pool and `span` (layout
  // in model/kv_transfer.hpp), converting between the pool's element type and the span's. The
  // caller has run check_kv_transfer: these only copy.
  void export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header, std::span<std::byte> span) const;
  void import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header, std::span<const std::byte> span);

  // Bytes one block takes across all layers, K and V, in `element`.
  static size_t bytes_per_block(const model_config& config, int block_size, dtype element);

 private:
  struct aligned_free {
    void operator()(std::byte* p) const;
  };
  size_t layer_offset(int layer) const { return static_cast<size_t>(layer) * 2 * pool_bytes_; }

  kv_cache_shape shape_;
  dtype element_;
  int64_t slot_elements_ = 0;  // num_kv_heads * head_dim
  size_t slot_bytes_ = 0;
  size_t pool_bytes_ = 0;  // one layer's K (or V) pool
  std::unique_ptr<std::byte[], aligned_free> data_;
};

}  // namespace troupe::cpu
