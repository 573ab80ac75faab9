// The KV data plane end to end in one process: stories260K's KV prefilled on model A, sent by a
// kv_sender as one frame per layer, imported by a kv_receiver into model B at other block ids,
// continues bitwise equal (the next decode step's logits), through the socket and through the
// direct in-process path; every frame that does not fit is refused without touching B's pool.

#include <gtest/gtest.h>

#include <zmq.hpp>

#include "kvtransfer/kv_local_receivers.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

// The receiver's own thread, learned from an expectation left to expire (only that thread
// expires), to tell which path a completed transfer took.
std::thread::id receiver_thread_of(kv_receiver& receiver, event_log& log, const kv_expectation& doomed) {
  receiver.expect(doomed);
  const auto event = log.wait_for(doomed.transfer_id);
  return event ? event->thread : std::thread::id();
}

TEST_F(kv_plane_test, a_transfer_through_the_socket_continues_bitwise_equal) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  kv_channel_settings settings;
  settings.allow_direct = false;  // through ZeroMQ over tcp, although the receiver is in this process
  event_log sent;
  kv_sender sender(settings, sent.sender_events());

  receiver.expect(expectation(7));
  sender.open(7, in(60s));
  send_whole_prompt(sender, 7);
  sender.ready(7, receiver.endpoint(), receiver.public_key());

  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << "the transfer did not complete; receiver refused " << receiver.stats().num_refused << ": "
                    << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  const kv_receiver_stats stats = receiver.stats();
  EXPECT_EQ(stats.num_frames, uint64_t(num_layers()));
  EXPECT_EQ(stats.num_refused, 0u);
  EXPECT_EQ(stats.num_expected, 0u);  // the lease ended with the transfer
  EXPECT_TRUE(sender.wait_idle(10s));
  EXPECT_EQ(sender.stats().num_frames, uint64_t(num_layers()));
  EXPECT_EQ(sender.stats().num_transfers, 0u);  // finished and sent: closed
  EXPECT_EQ(sent.size(), 0u);
  // Completed on the receiver's thread: the frames came through its socket.
  EXPECT_EQ(done->thread, receiver_thread_of(receiver, received, expectation(8, 0ms)));
}

TEST_F(kv_plane_test, a_transfer_inside_one_process_goes_direct_and_continues_bitwise_equal) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  kv_sender sender({}, {});

  receiver.expect(expectation(7));
  sender.ready(7, receiver.endpoint(), receiver.public_key());  // before open: kept until then
  sender.open(7, in(60s));
  send_whole_prompt(sender, 7);

  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(receiver.stats().num_frames, uint64_t(num_layers()));
  // Completed on the sender's thread: no socket in between.
  EXPECT_NE(done->thread, receiver_thread_of(receiver, received, expectation(8, 0ms)));
}

TEST_F(kv_plane_test, chunks_and_layer_ranges_in_any_order_complete_once_every_layer_has_every_token) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  receiver.expect(expectation(7));
  const int half = num_layers() / 2;
  // A chunked prefill: tokens [0, 6) then [4, 11) (the block a chunk left partly filled comes
  // again, whole), the second half of the layers before the first.
  std::vector<frame> frames = {frame_of(7, half, num_layers() - half, 0, 6), frame_of(7, 0, half, 0, 6),
                               frame_of(7, 0, half, 4, 11), frame_of(7, half, num_layers() - half, 4, 11)};
  for (size_t i = 0; i < frames.size(); ++i) {
    ASSERT_TRUE(deliver_to_local_receiver(receiver.endpoint(), frames[i].header_bytes(), frames[i].payload));
    EXPECT_EQ(received.size(), i + 1 == frames.size() ? 1u : 0u) << "after frame " << i;
  }
  const auto done = received.wait_for(7, 0ms);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
}

}  // namespace
}  // namespace troupe::test
