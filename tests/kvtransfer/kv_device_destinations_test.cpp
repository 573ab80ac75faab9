// The destinations a prefill worker's KV agent holds for its forward thread (kv_transport
// "cuda_ipc"): bounded and checked, taken once, dropped at their deadline.

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "kvtransfer/device_kv_copier.hpp"
#include "kvtransfer/kv_device_destinations.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

std::chrono::steady_clock::time_point in(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// The destinations a KV agent holds are bounded and checked: a handle no transport could have, no
// blocks, or more than the bound are refused naming why; an entry nobody takes goes at its deadline.
TEST(kv_device_destinations, refuses_bad_destinations_by_name_and_drops_expired_ones) {
  kv_device_destinations held(2);
  auto refused = [&](uint64_t id, kv_device_destination d, const std::string& expected) {
    try {
      held.put(id, std::move(d), in(60s));
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused(1, {"", {1}, {}}, "without a pool handle names blocks");
  refused(1, {"h", {1}, {kv_stage_route{{0, 2}, "kvtcp://127.0.0.1:1", ""}}},
          "a device destination with KV stage routes");
  refused(1, {"", {}, std::vector<kv_stage_route>(kv_stage_routes_max + 1)}, "65 KV stage routes, at most 64");
  refused(1, {std::string(max_kv_pool_handle_bytes + 1, 'h'), {1}}, "1025 bytes, at most 1024");
  refused(1, {"h", {}}, "names no blocks");
  held.put(1, {"h", {1}}, in(60s));
  held.put(2, {"h", {2}}, in(60s));
  refused(3, {"h", {3}}, "2 device destinations are held already");
  held.erase(2);
  held.put(3, {"h", {3}}, std::chrono::steady_clock::now());  // expires at once
  held.put(4, {"h", {4}}, in(60s));                           // room: 3 was dropped
  EXPECT_EQ(held.num_held(), 2u);
  const auto taken = held.take(4, in(1s));
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->block_ids, std::vector<int32_t>{4});
  EXPECT_FALSE(held.take(3, in(10ms)));
  // A pipelined pair's answer: the decode stages' receivers, or none (the decode is no pipeline).
  held.put(5, {"", {}, {kv_stage_route{{0, 2}, "kvtcp://127.0.0.1:1", ""}}}, in(60s));
  const auto routed = held.take(5, in(1s));
  ASSERT_TRUE(routed);
  ASSERT_EQ(routed->stage_routes.size(), 1u);
  EXPECT_EQ(routed->stage_routes[0].endpoint, "kvtcp://127.0.0.1:1");
  EXPECT_EQ(held.num_held(), 1u);
}

}  // namespace
}  // namespace troupe
