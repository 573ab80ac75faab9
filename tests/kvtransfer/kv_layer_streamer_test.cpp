// The prefill side's host path: kv_layer_streamer exports each layer a step wrote into a buffer
// taken from the sender's pool, so a request streamed after another reuses the buffers the first
// one's frames gave back (no fresh multi-MiB allocation per frame), and the KV still arrives
// bitwise equal: the decode step on the receiving model gives the prefill side's logits.

#include <gtest/gtest.h>

#include <vector>

#include "kvtransfer/kv_layer_streamer.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"
#include "tests/kvtransfer/kv_stream_steps.hpp"

namespace troupe::test {
namespace {

class kv_layer_streamer_host : public kv_plane_test {
 protected:
  void stream(kv_layer_streamer& out, int64_t request, const std::vector<int>& cuts) {
    stream_prompt(out, request, kv_transfer_prompt, blocks_a, cuts, num_layers());
  }
};

TEST_F(kv_layer_streamer_host, a_second_request_streams_from_the_buffers_the_first_gave_back) {
  kv_channel_settings settings;
  settings.allow_direct = false;                            // over the socket (plain TCP), as between two processes
  settings.pooled_idle_release = std::chrono::minutes(10);  // a slow machine's pause frees nothing
  event_log received;
  kv_receiver receiver(*b_, settings, received.receiver_events());
  kv_sender sender(settings, {});
  kv_layer_streamer out(*a_, sender, 60s);
  const size_t frames_per_request = size_t(2 * num_layers());  // two chunks
  uint64_t allocated_by_the_first = 0;
  for (auto [request, transfer] : {std::pair{int64_t(1), uint64_t(7)}, std::pair{int64_t(2), uint64_t(8)}}) {
    kv_expectation e = expectation(transfer);
    e.request_id = request;
    receiver.expect(e);
    out.start(request, transfer);
    // Every frame is queued before the destination is known, so none leaves (and gives its
    // buffer back) while the next is exported: how many buffers a request takes does not depend
    // on how fast the sender's thread runs, and the second request must take all of its from
    // the pool.
    stream(out, request, {0, 6, num_tokens});
    sender.ready(transfer, receiver.endpoint(), receiver.public_key());
    const auto done = received.wait_for(transfer);
    ASSERT_TRUE(done) << receiver.stats().last_refusal;
    ASSERT_TRUE(done->completed) << done->why;
    EXPECT_EQ(decode_on_b(), expected_) << "request " << request;
    out.forget(request, false);
    ASSERT_TRUE(sender.wait_idle(10s));
    if (request == 1) allocated_by_the_first = sender.stats().num_buffers_allocated;
  }
  const kv_sender_stats stats = sender.stats();
  EXPECT_EQ(stats.num_buffers_reused + stats.num_buffers_allocated, 2 * frames_per_request);
  EXPECT_EQ(allocated_by_the_first, frames_per_request);
  EXPECT_EQ(stats.num_buffers_allocated, allocated_by_the_first) << "the second request allocated";
  EXPECT_EQ(stats.num_buffers_reused, frames_per_request);
  EXPECT_EQ(out.num_streams(), 0u);
}

}  // namespace
}  // namespace troupe::test
