// The decode side's lease table on its own: no sockets, threads, model or clock. Leases are made,
// frames judged by their headers and booked, and deadlines passed by handing the table a time;
// every ending (complete, failed, expired, cancelled) happens exactly once and leaves no lease.

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "kvtransfer/kv_lease_table.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Two layers, blocks of 4 tokens, a pool of 8 blocks.
model_config small_config() {
  model_config c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  return c;
}
constexpr kv_cache_shape small_pool{8, 4};
const clock_type::time_point t0 = clock_type::time_point() + 1h;

kv_expectation lease_for(uint64_t transfer_id, int32_t num_tokens = 8, std::vector<int32_t> blocks = {5, 2}) {
  kv_expectation e;
  e.transfer_id = transfer_id;
  e.request_id = 100 + static_cast<int64_t>(transfer_id);
  e.block_ids = std::move(blocks);
  e.num_tokens = num_tokens;
  e.deadline = t0 + 10ms;
  return e;
}

// The frame of layers [first_layer, first_layer + num_layers) of a model `c` carrying tokens
// [begin, end) of the lease's request: with bytes (as the host path sends them), or in place.
kv_frame_header frame_of(const model_config& c, uint64_t transfer_id, int first_layer, int num_layers, int32_t begin,
                         int32_t end, bool in_place) {
  kv_frame_header h;
  h.transfer_id = transfer_id;
  h.request_id = 100 + static_cast<int64_t>(transfer_id);
  h.token_begin = begin;
  h.token_end = end;
  const int num_blocks = (end + small_pool.block_size - 1) / small_pool.block_size - begin / small_pool.block_size;
  h.span = kv_span_for(c, small_pool, num_blocks, first_layer, num_layers, dtype::f32);
  h.in_place = in_place;
  h.payload_bytes = in_place ? 0 : kv_span_bytes(h.span);
  return h;
}

// The same of the two-layer model, with bytes.
kv_frame_header frame(uint64_t transfer_id, int first_layer, int32_t begin, int32_t end, int num_layers = 1) {
  return frame_of(small_config(), transfer_id, first_layer, num_layers, begin, end, false);
}

TEST(kv_lease_table, a_lease_completes_once_every_layer_has_every_token_and_is_then_gone) {
  kv_lease_table table(small_config(), small_pool, false);
  table.expect(lease_for(1));
  ASSERT_EQ(table.size(), 1u);
  // Chunk [0, 6) of both layers, then [4, 8): the block the first chunk left partly filled is sent
  // again, whole.
  for (int layer = 0; layer < 2; ++layer) {
    const kv_frame_header h = frame(1, layer, 0, 6);
    const kv_frame_verdict v = table.admit(h, h.payload_bytes);
    ASSERT_NE(v.lease, nullptr) << v.refusal;
    EXPECT_EQ(std::vector<int32_t>(table.blocks_of(*v.lease, h).begin(), table.blocks_of(*v.lease, h).end()),
              (std::vector<int32_t>{5, 2}));
    EXPECT_FALSE(table.book(h));
  }
  const kv_frame_header second = frame(1, 0, 4, 8);
  kv_frame_verdict v = table.admit(second, second.payload_bytes);
  ASSERT_NE(v.lease, nullptr) << v.refusal;
  EXPECT_EQ(std::vector<int32_t>(table.blocks_of(*v.lease, second).begin(), table.blocks_of(*v.lease, second).end()),
            (std::vector<int32_t>{2}));
  EXPECT_FALSE(table.book(second));  // layer 1 is still at 6
  const kv_frame_header last = frame(1, 1, 4, 8);
  ASSERT_NE(table.admit(last, last.payload_bytes).lease, nullptr);
  const std::optional<kv_lease_outcome> done = table.book(last);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed);
  EXPECT_EQ(done->transfer_id, 1u);
  EXPECT_EQ(done->request_id, 101);
  EXPECT_EQ(table.size(), 0u);
  // Nothing more comes of it: a late frame is refused, failing nothing; its deadline ends nothing.
  v = table.admit(last, last.payload_bytes);
  EXPECT_EQ(v.lease, nullptr);
  EXPECT_FALSE(v.failed);
  EXPECT_NE(v.refusal.find("KV transfer 1 (request 101) is not expected"), std::string::npos) << v.refusal;
  EXPECT_TRUE(table.expire(t0 + 1h).empty());
}

TEST(kv_lease_table, a_frame_of_several_layers_counts_for_each) {
  kv_lease_table table(small_config(), small_pool, false);
  table.expect(lease_for(1));
  const kv_frame_header h = frame(1, 0, 0, 8, 2);
  ASSERT_NE(table.admit(h, h.payload_bytes).lease, nullptr);
  const std::optional<kv_lease_outcome> done = table.book(h);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed);
}

TEST(kv_lease_table, bad_expectations_are_refused_naming_the_field) {
  kv_lease_table table(small_config(), small_pool, false);
  auto refusal = [&](kv_expectation e) -> std::string {
    try {
      table.expect(std::move(e));
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(refusal(lease_for(1, 0)).find("num_tokens 0 is not positive"), std::string::npos);
  EXPECT_NE(refusal(lease_for(1, 9)).find("2 block_ids for 9 tokens, which need 3"), std::string::npos);
  EXPECT_NE(refusal(lease_for(1, 8, {5, 8})).find("block id 8 is outside the pool of 8 blocks"), std::string::npos);
  EXPECT_NE(refusal(lease_for(1, 8, {-1, 2})).find("block id -1 is outside"), std::string::npos);
  EXPECT_NE(refusal(lease_for(1, 8, {5, 5})).find("block id 5 appears twice"), std::string::npos);
  kv_expectation paired = lease_for(1);
  paired.in_place = true;
  paired.device_pair = "pair";
  EXPECT_NE(refusal(paired).find("a device_pair needs an in-place expectation and a receiver with an nccl inbox"),
            std::string::npos);
  EXPECT_EQ(table.size(), 0u);
  table.expect(lease_for(1));
  EXPECT_NE(refusal(lease_for(1)).find("KV transfer 1 (request 101): transfer_id is already expected"),
            std::string::npos);
  EXPECT_EQ(table.size(), 1u);

  kv_lease_table with_inbox(small_config(), small_pool, true);
  kv_expectation not_in_place = lease_for(2);
  not_in_place.device_pair = "pair";
  EXPECT_THROW(with_inbox.expect(not_in_place), std::invalid_argument);
  with_inbox.expect(paired);
  EXPECT_EQ(with_inbox.size(), 1u);
}

TEST(kv_lease_table, a_frame_for_no_lease_is_refused_and_fails_nothing) {
  kv_lease_table table(small_config(), small_pool, false);
  table.expect(lease_for(1));
  const kv_frame_header unknown = frame(2, 0, 0, 8);
  kv_frame_verdict v = table.admit(unknown, unknown.payload_bytes);
  EXPECT_EQ(v.lease, nullptr);
  EXPECT_FALSE(v.failed);
  EXPECT_EQ(v.refusal, "KV transfer 2 (request 102) is not expected (unknown, finished, cancelled or timed out)");
  EXPECT_EQ(table.size(), 1u);
  // A late frame of a cancelled transfer: the same.
  EXPECT_EQ(table.cancel(1), std::optional<std::string>(""));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.cancel(1));  // cancelled once only
  const kv_frame_header late = frame(1, 0, 0, 8);
  v = table.admit(late, late.payload_bytes);
  EXPECT_EQ(v.lease, nullptr);
  EXPECT_FALSE(v.failed);
  EXPECT_NE(v.refusal.find("is not expected"), std::string::npos);
  EXPECT_FALSE(table.book(late));  // nothing to book into
}

// Each way a frame may not fit: it fails its lease (its sender is broken), once, naming why.
TEST(kv_lease_table, a_frame_that_does_not_fit_fails_its_lease_naming_why) {
  struct bad_frame {
    std::string why;
    kv_frame_header h;
    size_t payload_size;
  };
  std::vector<bad_frame> cases;
  auto add = [&](std::string why, auto change) {
    kv_frame_header h = frame(1, 0, 0, 4);
    size_t payload = h.payload_bytes;
    change(h, payload);
    cases.push_back({std::move(why), h, payload});
  };
  add("the frame names request 7, the transfer is for request 101",
      [](kv_frame_header& h, size_t&) { h.request_id = 7; });
  add("the frame says its KV was written in place", [](kv_frame_header& h, size_t& p) {
    h.in_place = true;
    h.payload_bytes = p = 0;
  });
  add("the frame carries a pair sequence, the transfer is not received over an nccl pair",
      [](kv_frame_header& h, size_t&) { h.sequenced = true; });
  add("the header announces payload_bytes 256, the payload has 255", [](kv_frame_header&, size_t& p) { p -= 1; });
  add("geometry block_size 4, num_kv_heads 1, head_dim 4 differs from the model's 4, 2, 4",
      [](kv_frame_header& h, size_t&) { h.span.num_kv_heads = 1; });
  add("layer range first 1 count 2 lies outside the model's 2 layers",
      [](kv_frame_header& h, size_t&) { h.span.first_layer = 1, h.span.num_layers = 2; });
  add("token_end 12 is past the transfer's 8 tokens", [](kv_frame_header& h, size_t&) { h.token_end = 12; });
  add("token_begin 4 of layer 0 leaves a gap: tokens [0, 0) have arrived",
      [](kv_frame_header& h, size_t&) { h.token_begin = 4, h.token_end = 8; });
  for (const bad_frame& c : cases) {
    kv_lease_table table(small_config(), small_pool, false);
    table.expect(lease_for(1));
    const kv_frame_verdict v = table.admit(c.h, c.payload_size);
    EXPECT_EQ(v.lease, nullptr) << c.why;
    EXPECT_NE(v.refusal.find("KV transfer 1 (request 101): " + c.why), std::string::npos) << v.refusal;
    ASSERT_TRUE(v.failed) << c.why;
    EXPECT_FALSE(v.failed->completed);
    EXPECT_EQ(v.failed->request_id, 101);
    EXPECT_NE(v.failed->why.find("KV transfer 1 (request 101) failed: " + c.why), std::string::npos) << v.failed->why;
    EXPECT_EQ(table.size(), 0u) << c.why;
    // The next frame for it is refused as unknown: the lease failed once.
    const kv_frame_header good = frame(1, 0, 0, 4);
    EXPECT_FALSE(table.admit(good, good.payload_bytes).failed) << c.why;
  }
  // Without a pair, an in-place transfer refuses frames with bytes.
  kv_lease_table table(small_config(), small_pool, false);
  kv_expectation in_place = lease_for(1);
  in_place.in_place = true;
  table.expect(in_place);
  const kv_frame_header bytes = frame(1, 0, 0, 4);
  const kv_frame_verdict v = table.admit(bytes, bytes.payload_bytes);
  ASSERT_TRUE(v.failed);
  EXPECT_NE(v.failed->why.find("the frame carries bytes, the transfer expects its KV written in place"),
            std::string::npos);
}

TEST(kv_lease_table, leases_past_their_deadline_fail_naming_the_layer_furthest_behind) {
  kv_lease_table table(small_config(), small_pool, false);
  table.expect(lease_for(1));  // deadline t0 + 10ms
  kv_expectation later = lease_for(2, 4, {7});
  later.deadline = t0 + 1s;
  table.expect(later);
  const kv_frame_header h = frame(1, 0, 0, 8);
  ASSERT_NE(table.admit(h, h.payload_bytes).lease, nullptr);
  EXPECT_FALSE(table.book(h));  // layer 1 has nothing yet

  EXPECT_TRUE(table.expire(t0).empty());
  EXPECT_TRUE(table.expire(t0 + 9ms).empty());
  const std::vector<kv_lease_outcome> expired = table.expire(t0 + 10ms);  // at the deadline: gone
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_FALSE(expired[0].completed);
  EXPECT_EQ(expired[0].transfer_id, 1u);
  EXPECT_EQ(expired[0].why, "KV transfer 1 (request 101) failed: its deadline passed with layer 1 at 0 of 8 tokens");
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.expire(t0 + 10ms).empty());  // once only
  // Its late frames are refused; the other lease still completes.
  EXPECT_FALSE(table.admit(h, h.payload_bytes).lease);
  const kv_frame_header other = frame(2, 0, 0, 4, 2);
  ASSERT_NE(table.admit(other, other.payload_bytes).lease, nullptr);
  ASSERT_TRUE(table.book(other));
  EXPECT_TRUE(table.expire(t0 + 1h).empty());
}

TEST(kv_lease_table, a_frame_that_could_not_be_taken_fails_its_lease_and_ends_its_pair) {
  kv_lease_table table(small_config(), small_pool, true);
  kv_expectation paired = lease_for(1);
  paired.in_place = true;
  paired.device_pair = "pair 3";
  table.expect(paired);
  const kv_frame_verdict v = table.fail(1, "the import threw");
  EXPECT_EQ(v.refusal, "KV transfer 1 (request 101): the import threw");
  ASSERT_TRUE(v.failed);
  EXPECT_EQ(v.failed->why, "KV transfer 1 (request 101) failed: the import threw");
  EXPECT_EQ(v.failed->device_pair, "pair 3");  // its owner ends the pair
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.fail(1, "again").failed);  // failed once only

  // A cancelled pair's name goes back to the canceller, which ends it.
  table.expect(paired);
  EXPECT_EQ(table.cancel(1), std::optional<std::string>("pair 3"));
}

// kv_transport "nccl": a frame's tokens are accepted when its receive is queued and in only once
// the receive completes; gaps are judged against what was accepted.
TEST(kv_lease_table, accepted_tokens_close_gaps_but_only_booked_ones_complete) {
  kv_lease_table table(small_config(), small_pool, true);
  kv_expectation paired = lease_for(1);
  paired.in_place = true;
  paired.device_pair = "pair";
  table.expect(paired);
  auto in_place_frame = [](int layer, int32_t begin, int32_t end) {
    kv_frame_header h = frame(1, layer, begin, end);
    h.in_place = true;
    h.sequenced = true;
    h.payload_bytes = kv_frame_sequence_bytes;
    return h;
  };
  const kv_frame_header first = in_place_frame(0, 0, 4);
  kv_frame_verdict v = table.admit(first, kv_frame_sequence_bytes);
  ASSERT_NE(v.lease, nullptr) << v.refusal;
  table.accept(*v.lease, first);
  // The next chunk of layer 0 fits (tokens [0, 4) were accepted), before the first is booked.
  const kv_frame_header second = in_place_frame(0, 4, 8);
  v = table.admit(second, kv_frame_sequence_bytes);
  ASSERT_NE(v.lease, nullptr) << v.refusal;
  table.accept(*v.lease, second);
  EXPECT_EQ(table.find(1)->num_received[0], 0);
  EXPECT_EQ(table.find(1)->num_accepted[0], 8);
  EXPECT_FALSE(table.book(first));
  EXPECT_FALSE(table.book(second));
  const kv_frame_header layer1 = in_place_frame(1, 0, 8);
  ASSERT_NE(table.admit(layer1, kv_frame_sequence_bytes).lease, nullptr);
  const std::optional<kv_lease_outcome> done = table.book(layer1);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed);
  EXPECT_TRUE(done->device_pair.empty());  // a completed pair goes on
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// Four layers: a pipeline stage's receiver leases layers 0-1 only; the decode engine's lease
// takes layers 0-1 as relayed by that stage (one in-place frame, all tokens) and 2-3 with bytes.
model_config four_layers() {
  model_config c = small_config();
  c.num_layers = 4;
  return c;
}

TEST(kv_lease_table, a_stages_lease_covers_its_layers_only) {
  const model_config c = four_layers();
  kv_lease_table table(c, small_pool, false);
  kv_expectation e = lease_for(1);
  e.layers = {0, 2};
  table.expect(e);
  const kv_frame_header outside = frame_of(c, 1, 1, 2, 0, 8, false);
  kv_frame_verdict refused = table.admit(outside, outside.payload_bytes);
  EXPECT_EQ(refused.lease, nullptr);
  EXPECT_NE(refused.refusal.find("the frame's layers 1-2 are not among the transfer's (0-1)"), std::string::npos)
      << refused.refusal;
  kv_expectation stage = lease_for(3);
  stage.layers = {0, 2};
  table.expect(stage);
  const kv_frame_header both = frame_of(c, 3, 0, 2, 0, 8, false);  // the prefill stage's push
  ASSERT_NE(table.admit(both, both.payload_bytes).lease, nullptr);
  const std::optional<kv_lease_outcome> done = table.book(both);
  ASSERT_TRUE(done) << "layers 2-3 are another stage's: the lease is complete";
  EXPECT_TRUE(done->completed);
}

TEST(kv_lease_table, relayed_layers_come_in_place_whole_and_the_rest_with_bytes) {
  const model_config c = four_layers();
  kv_lease_table table(c, small_pool, false);
  kv_expectation e = lease_for(1);
  e.relayed = {0, 2};
  table.expect(e);
  // Each refusal judged on a lease of its own (a frame that does not fit fails its lease).
  const auto refusal = [&](const kv_frame_header& h) {
    kv_lease_table judge(c, small_pool, false);
    judge.expect(e);
    const kv_frame_verdict v = judge.admit(h, h.payload_bytes);
    return v.lease ? std::string("admitted") : v.refusal;
  };
  EXPECT_NE(refusal(frame_of(c, 1, 0, 1, 0, 8, false)).find("come from the decode's pipeline stages (0-1)"),
            std::string::npos);
  EXPECT_NE(refusal(frame_of(c, 1, 1, 2, 0, 8, true)).find("the frame reaches past them"), std::string::npos);
  EXPECT_NE(refusal(frame_of(c, 1, 2, 1, 0, 8, true)).find("expects its bytes"), std::string::npos);
  EXPECT_NE(refusal(frame_of(c, 1, 0, 2, 0, 4, true)).find("must cover tokens [0, 8)"), std::string::npos);

  for (int layer = 2; layer < 4; ++layer) {
    const kv_frame_header h = frame_of(c, 1, layer, 1, 0, 8, false);
    ASSERT_NE(table.admit(h, h.payload_bytes).lease, nullptr);
    EXPECT_FALSE(table.book(h));
  }
  const kv_frame_header relay = frame_of(c, 1, 0, 2, 0, 8, true);
  const kv_frame_verdict v = table.admit(relay, 0);
  ASSERT_NE(v.lease, nullptr) << v.refusal;
  const std::optional<kv_lease_outcome> done = table.book(relay);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed);

  kv_expectation bad = lease_for(4);
  bad.relayed = {0, 2};
  bad.in_place = true;
  EXPECT_THROW(table.expect(bad), std::invalid_argument);
  bad = lease_for(4);
  bad.layers = {0, 5};
  EXPECT_THROW(table.expect(bad), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// A give-up frame fits any live lease of its request, whatever its span; its payload size must
// be what it announced.
TEST(kv_lease_table, a_give_up_frame_fits_its_lease_by_request_alone) {
  kv_lease_table table(small_config(), small_pool, false);
  table.expect(lease_for(1));
  const kv_frame_header h = kv_give_up_header(1, 101, 12);
  EXPECT_NE(table.admit(h, 12).lease, nullptr);
  const kv_frame_verdict lying = table.admit(h, 11);
  EXPECT_EQ(lying.lease, nullptr);
  EXPECT_NE(lying.refusal.find("announces 12 bytes of reason, it has 11"), std::string::npos) << lying.refusal;
  table.expect(lease_for(2));
  const kv_frame_verdict other = table.admit(kv_give_up_header(2, 999, 0), 0);
  EXPECT_NE(other.refusal.find("names request 999"), std::string::npos) << other.refusal;
}

}  // namespace
}  // namespace troupe::test
