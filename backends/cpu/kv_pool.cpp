#include "backends/cpu/kv_pool.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::cpu {

kv_pool::kv_pool(const model_config& config, kv_cache_shape shape) : shape_(shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0) {
    throw std::runtime_error("KV cache shape needs num_blocks > 0 and block_size > 0, got " +
                             std::to_string(shape.num_blocks) + " blocks of " +
                             std::to_string(shape.block_size));
  }
  slot_floats_ = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  pool_floats_ = static_cast<size_t>(num_slots()) * slot_floats_;
  data_.assign(static_cast<size_t>(config.num_layers) * 2 * pool_floats_, 0.0f);
}

void kv_pool::write(int layer, const float* k, const float* v, int64_t ld,
                    const int64_t* slot_mapping, int64_t num_tokens) {
  float* key_pool = keys(layer);
  float* value_pool = values(layer);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots()) {
      throw std::runtime_error("slot_mapping[" + std::to_string(t) + "] = " +
                               std::to_string(slot) + " is outside the KV pool of " +
                               std::to_string(num_slots()) + " slots");
    }
    std::memcpy(key_pool + slot * slot_floats_, k + t * ld, slot_floats_ * sizeof(float));
    std::memcpy(value_pool + slot * slot_floats_, v + t * ld, slot_floats_ * sizeof(float));
  }
}

void kv_pool::export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<std::byte> span) const {
  const size_t block_floats = static_cast<size_t>(shape_.block_size) * slot_floats_;
  const size_t block_bytes = block_floats * kv_element_bytes(header.element);
  std::byte* out = span.data();
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (const float* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        convert_kv_elements(dtype::f32, reinterpret_cast<const std::byte*>(side + block * block_floats),
                            header.element, out, block_floats);
        out += block_bytes;
      }
    }
  }
}

void kv_pool::import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<const std::byte> span) {
  const size_t block_floats = static_cast<size_t>(shape_.block_size) * slot_floats_;
  const size_t block_bytes = block_floats * kv_element_bytes(header.element);
  const std::byte* in = span.data();
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (float* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        convert_kv_elements(header.element, in, dtype::f32, reinterpret_cast<std::byte*>(side + block * block_floats),
                            block_floats);
        in += block_bytes;
      }
    }
  }
}

size_t kv_pool::bytes_per_block(const model_config& config, int block_size) {
  return static_cast<size_t>(config.num_layers) * 2 * block_size * config.num_kv_heads *
         config.head_dim * sizeof(float);
}

}  // namespace troupe::cpu
