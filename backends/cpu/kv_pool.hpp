#pragma once
// The paged KV cache of the CPU backend, f32.
//
// Layout: for every layer, one K pool and one V pool, each
//     [num_blocks, block_size, num_kv_heads, head_dim]
// contiguous and row-major, so a slot (block * block_size + offset) holds all KV heads of one
// token side by side (num_kv_heads * head_dim floats) and a block is one contiguous run of
// block_size such slots. The whole cache is one allocation:
//     [num_layers, 2 (K then V), num_blocks, block_size, num_kv_heads, head_dim].

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/forward_batch.hpp"
#include "model/kv_transfer.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"

namespace troupe::cpu {

class kv_pool {
 public:
  kv_pool(const model_config& config, kv_cache_shape shape);

  kv_cache_shape shape() const { return shape_; }
  int64_t num_slots() const { return static_cast<int64_t>(shape_.num_blocks) * shape_.block_size; }
  int64_t slot_floats() const { return slot_floats_; }  // num_kv_heads * head_dim

  float* keys(int layer) { return data_.data() + layer_offset(layer); }                   // [slots, kv_heads, head_dim]
  float* values(int layer) { return data_.data() + layer_offset(layer) + pool_floats_; }  // [slots, kv_heads, head_dim]
  const float* keys(int layer) const { return data_.data() + layer_offset(layer); }
  const float* values(int layer) const { return data_.data() + layer_offset(layer) + pool_floats_; }

  // Writes each new token's K and V (rows of k / v, ld floats apart, slot_floats() used) into
  // its slot of `layer`. Throws std::runtime_error on a slot outside the pool.
  void write(int layer, const float* k, const float* v, int64_t ld, const int64_t* slot_mapping,
             int64_t num_tokens);

  // Copies the span `header` describes between blocks `block_ids` of the pool and `span` (layout
  // in model/kv_transfer.hpp), converting from / to f32. The caller has run check_kv_transfer:
  // these only copy.
  void export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header, std::span<std::byte> span) const;
  void import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                     std::span<const std::byte> span);

  // Bytes one block takes across all layers, K and V.
  static size_t bytes_per_block(const model_config& config, int block_size);

 private:
  size_t layer_offset(int layer) const { return static_cast<size_t>(layer) * 2 * pool_floats_; }

  kv_cache_shape shape_;
  int64_t slot_floats_ = 0;
  size_t pool_floats_ = 0;  // one layer's K (or V) pool
  std::vector<float> data_;
};

}  // namespace troupe::cpu
