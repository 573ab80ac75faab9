// The kv_pool_handle of kv_transport "nccl" (kvtransfer/nccl_pool_handle): the pair's id and the
// decode side's pool geometry survive the trip, and bytes from another node that are not a
// handle are refused naming the field before the prefill side joins anything with them.

#include <gtest/gtest.h>

#include <string>

#include "kvtransfer/device_kv_copier.hpp"
#include "kvtransfer/nccl_pool_handle.hpp"

namespace troupe::test {
namespace {

device_kv_pool pool() { return device_kv_pool{3, nullptr, 5, 4096, 1 << 20, dtype::bf16}; }

void expect_refused(const std::string& bytes, const std::string& field) {
  try {
    decode_nccl_pool_handle(bytes);
    ADD_FAILURE() << "decoded, expected a refusal naming " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(nccl_pool_handle, the_id_and_the_geometry_round_trip_within_the_handle_bound) {
  const std::string id(128, '\x7f');  // an ncclUniqueId's size
  const std::string bytes = encode_nccl_pool_handle(id, pool());
  EXPECT_LE(bytes.size(), max_kv_pool_handle_bytes);
  const nccl_pool_handle h = decode_nccl_pool_handle(bytes);
  EXPECT_EQ(h.pair_id, id);
  EXPECT_EQ(h.geometry.num_layers, 5);
  EXPECT_EQ(h.geometry.num_blocks, 4096);
  EXPECT_EQ(h.geometry.block_bytes, size_t(1) << 20);
  EXPECT_EQ(h.geometry.element, dtype::bf16);
  EXPECT_EQ(h.geometry.base, nullptr) << "the pool is in another process";
}

TEST(nccl_pool_handle, bytes_that_are_not_a_handle_are_refused_naming_the_field) {
  const std::string good = encode_nccl_pool_handle("pair", pool());
  expect_refused("", "0 bytes, fewer than");
  expect_refused("xxxx" + good.substr(4), "magic");
  std::string version = good;
  version[4] = 9;
  expect_refused(version, "version 9");
  expect_refused(good + "z", "a pair id of 4 bytes in a handle of");
  std::string element = good;
  element.back() = 17;
  expect_refused(element, "element type 17");
  std::string blocks = good;
  for (int i = 0; i < 4; ++i) blocks[12 + 4 + 4 + i] = 0;  // num_blocks 0
  expect_refused(blocks, "num_blocks 0");
  EXPECT_THROW(encode_nccl_pool_handle("", pool()), std::invalid_argument);
  EXPECT_THROW(encode_nccl_pool_handle(std::string(max_nccl_pair_id_bytes + 1, 'i'), pool()), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test
