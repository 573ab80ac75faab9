// The copies of the device transports (CUDA IPC, NCCL) as offsets, on the CPU: runs merge blocks
// consecutive on both sides and only those, every offset is the pool layout's, and a geometry or
// id the other process sent that does not fit is refused by name before anything is copied.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kvtransfer/device_kv_runs.hpp"

namespace troupe {
namespace {

// 3 layers of 10 blocks of 256 bytes per side: layer L side S block B at ((2L + S) * 10 + B) * 256.
device_kv_pool pool(int num_blocks = 10) { return device_kv_pool{0, nullptr, 3, num_blocks, 256, dtype::bf16}; }

void expect_refused(const std::string& field, const device_kv_pool& src, std::vector<int32_t> from,
                    const device_kv_pool& dst, std::vector<int32_t> to, int first_layer = 0, int num_layers = 1) {
  try {
    device_kv_runs(src, from, dst, to, first_layer, num_layers);
    ADD_FAILURE() << "accepted, expected a refusal naming " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what() << " does not name " << field;
  }
}

TEST(device_kv_runs, blocks_consecutive_on_both_sides_move_in_one_run_per_layer_and_side) {
  const std::vector<int32_t> from = {2, 3, 4, 8}, to = {5, 6, 7, 0};
  const std::vector<device_kv_run> runs = device_kv_runs(pool(), from, pool(), to, 1, 2);
  // Layers 1 and 2, K and V: [2, 3, 4] -> [5, 6, 7] as one run, 8 -> 0 as another.
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(runs[0].src_offset, ((2 * 1 + 0) * 10 + 2) * 256u);
  EXPECT_EQ(runs[0].dst_offset, ((2 * 1 + 0) * 10 + 5) * 256u);
  EXPECT_EQ(runs[0].bytes, 3 * 256u);
  EXPECT_EQ(runs[1].src_offset, ((2 * 1 + 0) * 10 + 8) * 256u);
  EXPECT_EQ(runs[1].dst_offset, ((2 * 1 + 0) * 10 + 0) * 256u);
  EXPECT_EQ(runs[1].bytes, 256u);
  EXPECT_EQ(runs[3].src_offset, ((2 * 1 + 1) * 10 + 8) * 256u);  // layer 1, V
  EXPECT_EQ(runs[7].dst_offset, ((2 * 2 + 1) * 10 + 0) * 256u);  // layer 2, V, last run
  size_t total = 0;
  for (const device_kv_run& run : runs) total += run.bytes;
  EXPECT_EQ(total, 2u * 2 * from.size() * 256);
}

TEST(device_kv_runs, a_run_breaks_where_either_side_is_not_consecutive) {
  // Consecutive on the source only, then on the destination only: no merging either time.
  const std::vector<device_kv_run> runs =
      device_kv_runs(pool(), std::vector<int32_t>{1, 2, 7, 3}, pool(), std::vector<int32_t>{4, 9, 5, 6}, 0, 1);
  ASSERT_EQ(runs.size(), 8u);  // 4 blocks x (K, V)
  for (const device_kv_run& run : runs) EXPECT_EQ(run.bytes, 256u);
  // Pools of different sizes: the destination's offsets use its own block count.
  const std::vector<device_kv_run> other =
      device_kv_runs(pool(), std::vector<int32_t>{0}, pool(40), std::vector<int32_t>{39}, 2, 1);
  EXPECT_EQ(other[1].dst_offset, ((2 * 2 + 1) * 40 + 39) * 256u);
}

TEST(device_kv_runs, what_does_not_fit_is_refused_by_name) {
  device_kv_pool f16 = pool();
  f16.element = dtype::f16;
  expect_refused("element types bf16 and f16 differ", pool(), {0}, f16, {0});
  device_kv_pool wider = pool();
  wider.block_bytes = 512;
  expect_refused("block_bytes 256 (source) and 512", pool(), {0}, wider, {0});
  expect_refused("layer range first 2 count 2", pool(), {0}, pool(), {0}, 2, 2);
  expect_refused("layer range first 0 count 0", pool(), {0}, pool(), {0}, 0, 0);
  expect_refused("2 source blocks for 1 destination", pool(), {0, 1}, pool(), {0});
  expect_refused("source block id 10 is outside the pool of 10", pool(), {10}, pool(), {0});
  expect_refused("destination block id -1", pool(), {0}, pool(), {-1});
  expect_refused("destination block id 4 appears twice", pool(), {0, 1}, pool(), {4, 4});
}

}  // namespace
}  // namespace troupe
