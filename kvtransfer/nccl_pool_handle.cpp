#include "kvtransfer/nccl_pool_handle.hpp"

#include <stdexcept>

namespace troupe {

namespace {

constexpr uint32_t handle_magic = 0x434e5654;  // "TVNC"
constexpr uint32_t handle_version = 1;
// magic, version, id size (u32 each), the id, num_layers, num_blocks (i32), block_bytes (u64), element (u8)
constexpr size_t fixed_bytes = 4 + 4 + 4 + 4 + 4 + 8 + 1;

void put(std::string& out, uint64_t value, int num_bytes) {
  for (int i = 0; i < num_bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get(const std::string& in, size_t& at, int num_bytes) {
  uint64_t value = 0;
  for (int i = 0; i < num_bytes; ++i) value |= uint64_t(static_cast<unsigned char>(in[at + i])) << (8 * i);
  at += num_bytes;
  return value;
}

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("nccl pool handle: " + why); }

}  // namespace

std::string encode_nccl_pool_handle(const std::string& pair_id, const device_kv_pool& pool) {
  if (pair_id.empty() || pair_id.size() > max_nccl_pair_id_bytes) {
    refuse("a pair id of " + std::to_string(pair_id.size()) + " bytes, expected 1 to " +
           std::to_string(max_nccl_pair_id_bytes));
  }
  std::string out;
  out.reserve(fixed_bytes + pair_id.size());
  put(out, handle_magic, 4);
  put(out, handle_version, 4);
  put(out, pair_id.size(), 4);
  out += pair_id;
  put(out, static_cast<uint32_t>(pool.num_layers), 4);
  put(out, static_cast<uint32_t>(pool.num_blocks), 4);
  put(out, pool.block_bytes, 8);
  put(out, static_cast<uint8_t>(pool.element), 1);
  return out;
}

nccl_pool_handle decode_nccl_pool_handle(const std::string& bytes) {
  if (bytes.size() < fixed_bytes) {
    refuse(std::to_string(bytes.size()) + " bytes, fewer than the " + std::to_string(fixed_bytes) +
           " of its fixed fields");
  }
  size_t at = 0;
  if (const uint64_t magic = get(bytes, at, 4); magic != handle_magic)
    refuse("magic " + std::to_string(magic) + " is not \"TVNC\"");
  if (const uint64_t version = get(bytes, at, 4); version != handle_version) {
    refuse("version " + std::to_string(version) + ", expected " + std::to_string(handle_version));
  }
  const uint64_t id_bytes = get(bytes, at, 4);
  if (id_bytes == 0 || id_bytes > max_nccl_pair_id_bytes || bytes.size() != fixed_bytes + id_bytes) {
    refuse("a pair id of " + std::to_string(id_bytes) + " bytes in a handle of " + std::to_string(bytes.size()) +
           " (ids have 1 to " + std::to_string(max_nccl_pair_id_bytes) + ")");
  }
  nccl_pool_handle h;
  h.pair_id = bytes.substr(at, id_bytes);
  at += id_bytes;
  h.geometry.num_layers = static_cast<int32_t>(get(bytes, at, 4));
  h.geometry.num_blocks = static_cast<int32_t>(get(bytes, at, 4));
  h.geometry.block_bytes = get(bytes, at, 8);
  const uint64_t element = get(bytes, at, 1);
  if (h.geometry.num_layers <= 0 || h.geometry.num_blocks <= 0 || h.geometry.block_bytes == 0) {
    refuse("geometry num_layers " + std::to_string(h.geometry.num_layers) + ", num_blocks " +
           std::to_string(h.geometry.num_blocks) + ", block_bytes " + std::to_string(h.geometry.block_bytes) +
           " is not a pool's");
  }
  if (!is_kv_element(static_cast<dtype>(element))) {
    refuse("element type " + std::to_string(element) + " is not a KV cache type (f32, f16, bf16, q8_0, fp8_e4m3)");
  }
  h.geometry.element = static_cast<dtype>(element);
  return h;
}

}  // namespace troupe
