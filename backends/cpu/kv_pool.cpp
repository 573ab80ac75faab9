#include "backends/cpu/kv_pool.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "backends/cpu/paged_attention_kernels.hpp"

namespace troupe::cpu {

namespace {

constexpr size_t pool_alignment = 64;  // a cache line: a head's row starts on one when its bytes allow

// `count` elements (whole q8_0 blocks) from one KV type to another through f32, a stack buffer at
// a time, with the SIMD level's conversions.
void convert_run(dtype from, const std::byte* in, dtype to, std::byte* out, size_t count) {
  if (from == to) {
    std::memcpy(out, in, kv_bytes(from, count));
    return;
  }
  const attention_kernels& kernels = active_attention_kernels();
  constexpr size_t chunk = 1024;  // a multiple of q8_0's 32
  float values[chunk];            // [chunk] the elements on their way, as f32
  for (size_t done = 0; done < count; done += chunk) {
    const size_t n = std::min(chunk, count - done);
    kernels.decode_rows[static_cast<int>(from)](in + kv_bytes(from, done), static_cast<int64_t>(n), values);
    kernels.encode[static_cast<int>(to)](values, static_cast<int64_t>(n), out + kv_bytes(to, done));
  }
}

}  // namespace

void kv_pool::aligned_free::operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{pool_alignment}); }

kv_pool::kv_pool(const model_config& config, kv_cache_shape shape, dtype element) : shape_(shape), element_(element) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0) {
    throw std::runtime_error("KV cache shape needs num_blocks > 0 and block_size > 0, got " +
                             std::to_string(shape.num_blocks) + " blocks of " + std::to_string(shape.block_size));
  }
  check_kv_element(element, config.head_dim);
  slot_elements_ = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  slot_bytes_ = kv_bytes(element, static_cast<size_t>(slot_elements_));
  pool_bytes_ = static_cast<size_t>(num_slots()) * slot_bytes_;
  const size_t total = static_cast<size_t>(config.num_layers) * 2 * pool_bytes_;
  data_.reset(static_cast<std::byte*>(::operator new[](total, std::align_val_t{pool_alignment})));
  std::memset(data_.get(), 0, total);  // zeros decode as 0 in every type
}

void kv_pool::write(int layer, const float* k, const float* v, int64_t ld, const int64_t* slot_mapping,
                    int64_t num_tokens) {
  const kv_encode_fn encode = active_attention_kernels().encode[static_cast<int>(element_)];
  std::byte* key_pool = keys(layer);
  std::byte* value_pool = values(layer);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots()) {
      throw std::runtime_error("slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slot) +
                               " is outside the KV pool of " + std::to_string(num_slots()) + " slots");
    }
    encode(k + t * ld, slot_elements_, key_pool + slot * slot_bytes_);
    encode(v + t * ld, slot_elements_, value_pool + slot * slot_bytes_);
  }
}

void kv_pool::export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<std::byte> span) const {
  const size_t block_elements = static_cast<size_t>(shape_.block_size) * slot_elements_;
  const size_t pool_block_bytes = static_cast<size_t>(shape_.block_size) * slot_bytes_;
  const size_t span_block_bytes = kv_bytes(header.element, block_elements);
  std::byte* out = span.data();
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (const std::byte* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        convert_run(element_, side + block * pool_block_bytes, header.element, out, block_elements);
        out += span_block_bytes;
      }
    }
  }
}

void kv_pool::import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<const std::byte> span) {
  const size_t block_elements = static_cast<size_t>(shape_.block_size) * slot_elements_;
  const size_t pool_block_bytes = static_cast<size_t>(shape_.block_size) * slot_bytes_;
  const size_t span_block_bytes = kv_bytes(header.element, block_elements);
  const std::byte* in = span.data();
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (std::byte* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        convert_run(header.element, in, element_, side + block * pool_block_bytes, block_elements);
        in += span_block_bytes;
      }
    }
  }
}

size_t kv_pool::bytes_per_block(const model_config& config, int block_size, dtype element) {
  check_kv_element(element, config.head_dim);
  const size_t slot = kv_bytes(element, static_cast<size_t>(config.num_kv_heads) * config.head_dim);
  return static_cast<size_t>(config.num_layers) * 2 * block_size * slot;
}

}  // namespace troupe::cpu
