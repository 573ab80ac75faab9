#include "kvtransfer/device_kv_runs.hpp"

#include <set>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("device KV copy: " + why); }

void check_ids(const device_kv_pool& pool, std::span<const int32_t> ids, const char* side, bool unique) {
  std::set<int32_t> seen;
  for (int32_t id : ids) {
    if (id < 0 || id >= pool.num_blocks) {
      refuse(std::string(side) + " block id " + std::to_string(id) + " is outside the pool of " +
             std::to_string(pool.num_blocks) + " blocks");
    }
    if (unique && !seen.insert(id).second)
      refuse(std::string(side) + " block id " + std::to_string(id) + " appears twice");
  }
}

}  // namespace

size_t device_kv_offset(const device_kv_pool& pool, int layer, int side, int32_t block) {
  return ((static_cast<size_t>(layer) * 2 + side) * static_cast<size_t>(pool.num_blocks) + static_cast<size_t>(block)) *
         pool.block_bytes;
}

std::vector<device_kv_run> device_kv_runs(const device_kv_pool& src, std::span<const int32_t> src_blocks,
                                          const device_kv_pool& dst, std::span<const int32_t> dst_blocks,
                                          int first_layer, int num_layers) {
  if (src.block_bytes != dst.block_bytes || src.block_bytes == 0) {
    refuse("block_bytes " + std::to_string(src.block_bytes) + " (source) and " + std::to_string(dst.block_bytes) +
           " (destination) differ or are 0: both pools need the same geometry");
  }
  if (src.element != dst.element) {
    refuse(std::string("element types ") + std::string(dtype_name(src.element)) + " and " +
           std::string(dtype_name(dst.element)) + " differ: a device transport copies bytes without converting");
  }
  if (first_layer < 0 || num_layers <= 0 || int64_t{first_layer} + num_layers > src.num_layers ||
      int64_t{first_layer} + num_layers > dst.num_layers) {
    refuse("layer range first " + std::to_string(first_layer) + " count " + std::to_string(num_layers) +
           " lies outside the pools' " + std::to_string(src.num_layers) + " / " + std::to_string(dst.num_layers) +
           " layers");
  }
  if (src_blocks.size() != dst_blocks.size()) {
    refuse(std::to_string(src_blocks.size()) + " source blocks for " + std::to_string(dst_blocks.size()) +
           " destination blocks");
  }
  check_ids(src, src_blocks, "source", false);
  check_ids(dst, dst_blocks, "destination", true);

  std::vector<device_kv_run> runs;
  for (int layer = first_layer; layer < first_layer + num_layers; ++layer) {
    for (int side = 0; side < 2; ++side) {
      for (size_t i = 0; i < src_blocks.size();) {
        size_t n = 1;  // blocks i .. i + n consecutive on both sides
        while (i + n < src_blocks.size() && src_blocks[i + n] == src_blocks[i] + static_cast<int32_t>(n) &&
               dst_blocks[i + n] == dst_blocks[i] + static_cast<int32_t>(n)) {
          ++n;
        }
        runs.push_back({device_kv_offset(src, layer, side, src_blocks[i]),
                        device_kv_offset(dst, layer, side, dst_blocks[i]), n * src.block_bytes});
        i += n;
      }
    }
  }
  return runs;
}

}  // namespace troupe
