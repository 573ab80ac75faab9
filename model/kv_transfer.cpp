#include "model/kv_transfer.hpp"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/half_float.hpp"
#include "model/model.hpp"

namespace troupe {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("KV span: " + what); }

// a * b, refusing rather than wrapping: sizes come from the network later.
size_t checked_mul(size_t a, size_t b, const char* what) {
  if (b != 0 && a > std::numeric_limits<size_t>::max() / b) refuse(std::string(what) + " overflows size_t");
  return a * b;
}

void require_positive(int value, const char* field) {
  if (value <= 0) refuse(std::string(field) + " must be > 0, got " + std::to_string(value));
}

std::string mismatch(const char* field, int got, int model_value) {
  return std::string("header ") + field + " " + std::to_string(got) + " does not match the model's " +
         std::to_string(model_value);
}

}  // namespace

size_t kv_element_bytes(dtype element) {
  switch (element) {
    case dtype::f32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    default: break;
  }
  refuse("element type " + std::string(dtype_name(element)) + " is not f32, f16 or bf16");
}

size_t kv_block_elements(const kv_span_header& header) {
  require_positive(header.block_size, "block_size");
  require_positive(header.num_kv_heads, "num_kv_heads");
  require_positive(header.head_dim, "head_dim");
  const size_t per_slot = checked_mul(static_cast<size_t>(header.num_kv_heads), static_cast<size_t>(header.head_dim),
                                      "num_kv_heads * head_dim");
  return checked_mul(per_slot, static_cast<size_t>(header.block_size), "block elements");
}

size_t kv_span_bytes(const kv_span_header& header) {
  if (header.first_layer < 0) refuse("first_layer must be >= 0, got " + std::to_string(header.first_layer));
  require_positive(header.num_layers, "num_layers");
  require_positive(header.num_blocks, "num_blocks");
  const size_t element = kv_element_bytes(header.element);
  size_t bytes = checked_mul(kv_block_elements(header), element, "block bytes");
  bytes = checked_mul(bytes, static_cast<size_t>(header.num_blocks), "span bytes");
  bytes = checked_mul(bytes, 2, "span bytes");  // K and V
  return checked_mul(bytes, static_cast<size_t>(header.num_layers), "span bytes");
}

kv_span_header kv_span_for(const model_config& config, const kv_cache_shape& pool, int num_blocks, int first_layer,
                           int num_layers, dtype element) {
  return kv_span_header{first_layer, num_layers, num_blocks, pool.block_size, config.num_kv_heads, config.head_dim,
                        element};
}

void check_kv_transfer(const model_config& config, const kv_cache_shape& pool, std::span<const int32_t> block_ids,
                       const kv_span_header& header, size_t data_bytes, kv_transfer_direction direction) {
  if (header.num_kv_heads != config.num_kv_heads) refuse(mismatch("num_kv_heads", header.num_kv_heads, config.num_kv_heads));
  if (header.head_dim != config.head_dim) refuse(mismatch("head_dim", header.head_dim, config.head_dim));
  if (header.block_size != pool.block_size) refuse(mismatch("block_size", header.block_size, pool.block_size));
  if (header.first_layer < 0 || header.num_layers <= 0 ||
      int64_t{header.first_layer} + header.num_layers > config.num_layers) {
    refuse("layer range first_layer " + std::to_string(header.first_layer) + ", num_layers " +
           std::to_string(header.num_layers) + " is outside the model's " + std::to_string(config.num_layers) +
           " layers");
  }
  if (header.num_blocks < 0 || static_cast<size_t>(header.num_blocks) != block_ids.size()) {
    refuse("header num_blocks " + std::to_string(header.num_blocks) + " does not match the " +
           std::to_string(block_ids.size()) + " block ids given");
  }
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (block_ids[i] < 0 || block_ids[i] >= pool.num_blocks) {
      refuse("block id " + std::to_string(block_ids[i]) + " (block_ids[" + std::to_string(i) +
             "]) is outside the pool of " + std::to_string(pool.num_blocks) + " blocks");
    }
  }
  if (direction == kv_transfer_direction::import_into_pool) {
    std::vector<bool> seen(static_cast<size_t>(pool.num_blocks), false);  // pool-sized, never span-sized
    for (size_t i = 0; i < block_ids.size(); ++i) {
      if (seen[block_ids[i]]) refuse("block id " + std::to_string(block_ids[i]) + " appears twice in block_ids");
      seen[block_ids[i]] = true;
    }
  }
  const size_t expected = kv_span_bytes(header);  // also checks element, num_blocks > 0 and overflow
  if (data_bytes != expected) {
    refuse("data size " + std::to_string(data_bytes) + " bytes does not match the header's " +
           std::to_string(expected) + " bytes");
  }
}

void convert_kv_elements(dtype from, const std::byte* in, dtype to, std::byte* out, size_t count) {
  if (from == to) {
    std::memcpy(out, in, count * kv_element_bytes(from));
    return;
  }
  const size_t in_size = kv_element_bytes(from), out_size = kv_element_bytes(to);
  for (size_t i = 0; i < count; ++i) {
    float value;
    if (from == dtype::f32) {
      std::memcpy(&value, in + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, in + in_size * i, 2);
      value = from == dtype::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
    if (to == dtype::f32) {
      std::memcpy(out + 4 * i, &value, 4);
    } else {
      const uint16_t bits = to == dtype::f16 ? f32_to_f16(value) : f32_to_bf16(value);
      std::memcpy(out + out_size * i, &bits, 2);
    }
  }
}

}  // namespace troupe
