#include "model/kv_transfer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/half_float.hpp"
#include "model/model.hpp"
#include "model/quant/dequantize.hpp"
#include "model/quant/fp8.hpp"

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

bool is_kv_element(dtype element) {
  switch (element) {
    case dtype::f32:
    case dtype::f16:
    case dtype::bf16:
    case dtype::q8_0:
    case dtype::fp8_e4m3: return true;
    default: return false;
  }
}

void check_kv_element(dtype element, int head_dim) {
  // Not through refuse(): pools check their dtype here too, and they are not spans.
  if (!is_kv_element(element)) {
    throw std::invalid_argument("KV cache dtype " + std::string(dtype_name(element)) +
                                " is not one of f32, f16, bf16, q8_0, fp8_e4m3");
  }
  if (element == dtype::q8_0 && head_dim % q8_0_block_size != 0) {
    throw std::invalid_argument(
        "KV cache dtype q8_0 stores blocks of 32 along each head and needs head_dim to be a multiple of 32, got "
        "head_dim " +
        std::to_string(head_dim));
  }
}

size_t kv_bytes(dtype element, size_t count) {
  if (!is_kv_element(element)) check_kv_element(element, 0);
  if (element == dtype::q8_0 && count % q8_0_block_size != 0) {
    refuse("q8_0 holds whole blocks of 32 elements, got " + std::to_string(count));
  }
  return checked_mul(count / dtype_block_size(element), dtype_traits_of(element).block_bytes, "KV bytes");
}

void kv_encode_f32(dtype element, const float* in, std::byte* out, size_t count) {
  switch (element) {
    case dtype::f32: std::memcpy(out, in, count * 4); return;
    case dtype::f16:
    case dtype::bf16:
      for (size_t i = 0; i < count; ++i) {
        const uint16_t bits = element == dtype::f16 ? f32_to_f16(in[i]) : f32_to_bf16(in[i]);
        std::memcpy(out + 2 * i, &bits, 2);
      }
      return;
    case dtype::fp8_e4m3:
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<std::byte>(quant::f32_to_fp8_e4m3(in[i]));
      return;
    case dtype::q8_0:
      for (size_t b = 0; b < count / q8_0_block_size; ++b) {
        const float* x = in + b * q8_0_block_size;
        std::byte* block = out + b * q8_0_block_bytes;
        float amax = 0.0f;
        for (int64_t i = 0; i < q8_0_block_size; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t scale = f32_to_f16(d);
        std::memcpy(block, &scale, 2);
        for (int64_t i = 0; i < q8_0_block_size; ++i) {
          block[2 + i] = static_cast<std::byte>(static_cast<int8_t>(std::nearbyint(x[i] * inverse)));
        }
      }
      return;
    default: check_kv_element(element, 0);
  }
}

void kv_decode_f32(dtype element, const std::byte* in, float* out, size_t count) {
  switch (element) {
    case dtype::f32: std::memcpy(out, in, count * 4); return;
    case dtype::f16:
    case dtype::bf16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, 2);
        out[i] = element == dtype::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
      }
      return;
    case dtype::fp8_e4m3:
    case dtype::q8_0: quant::dequantize_row(element, in, out, static_cast<int64_t>(count)); return;
    default: check_kv_element(element, 0);
  }
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
  check_kv_element(header.element, header.head_dim);
  size_t bytes = kv_bytes(header.element, kv_block_elements(header));
  bytes = checked_mul(bytes, static_cast<size_t>(header.num_blocks), "span bytes");
  bytes = checked_mul(bytes, 2, "span bytes");  // K and V
  return checked_mul(bytes, static_cast<size_t>(header.num_layers), "span bytes");
}

kv_span_header kv_span_for(const model_config& config, const kv_cache_shape& pool, int num_blocks, int first_layer,
                           int num_layers, dtype element) {
  return kv_span_header{first_layer,         num_layers,      num_blocks, pool.block_size,
                        config.num_kv_heads, config.head_dim, element};
}

void check_kv_transfer(const model_config& config, const kv_cache_shape& pool, std::span<const int32_t> block_ids,
                       const kv_span_header& header, size_t data_bytes, kv_transfer_direction direction) {
  if (header.num_kv_heads != config.num_kv_heads)
    refuse(mismatch("num_kv_heads", header.num_kv_heads, config.num_kv_heads));
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
    std::memcpy(out, in, kv_bytes(from, count));
    return;
  }
  kv_bytes(from, count);  // refuses a type that is not a KV element, or a partial q8_0 block
  kv_bytes(to, count);
  constexpr size_t chunk = 1024;  // a multiple of q8_0's 32
  float values[chunk];            // [chunk] the elements as f32 on their way
  for (size_t done = 0; done < count; done += chunk) {
    const size_t n = std::min(chunk, count - done);
    kv_decode_f32(from, in + kv_bytes(from, done), values, n);
    kv_encode_f32(to, values, out + kv_bytes(to, done), n);
  }
}

}  // namespace troupe
