// The sender's leases: frames wait for their destination holding memory, bounded by
// max_buffered_bytes and released at the deadline, on cancel, or once handed over; a late
// destination gives the frames the deadline's whole window again; a socket to a peer that takes
// nothing is closed at the deadline with what ZeroMQ held for it.

#include <gtest/gtest.h>

#include <thread>

#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

TEST_F(kv_plane_test, frames_wait_for_ready_and_the_deadline_releases_them_with_one_event) {
  event_log sent;
  kv_sender sender({}, sent.sender_events());
  sender.open(7, in(100ms));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  const size_t size = f.payload.size();
  ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
  EXPECT_EQ(sender.stats().num_buffered_bytes, size);  // no destination yet: held
  EXPECT_EQ(sender.stats().num_transfers, 1u);
  const auto failed = sent.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("deadline"), std::string::npos) << failed->why;
  EXPECT_NE(failed->why.find("no ready"), std::string::npos) << failed->why;
  EXPECT_EQ(sender.stats().num_buffered_bytes, 0u);
  EXPECT_EQ(sender.stats().num_transfers, 0u);
  EXPECT_EQ(sender.stats().num_frames, 0u);
  frame late = frame_of(7, 1, 1, 0, num_tokens);
  EXPECT_FALSE(sender.send(late.header, std::move(late.payload)));  // closed
  EXPECT_TRUE(sender.wait_idle(5s));
  EXPECT_EQ(sent.count(7), 1u);
}

TEST_F(kv_plane_test, a_late_ready_gives_the_frames_the_whole_window_from_the_reservation) {
  // The decode side reserves late (it was behind) and counts its deadline from the reservation;
  // the prefill side must too, or the transfer fails at its first window's end with the
  // reservation made and the frames on their way.
  event_log received;
  kv_receiver receiver(*b_, zmq_channel(), received.receiver_events());
  event_log sent;
  kv_sender sender(zmq_channel(), sent.sender_events());
  // Each moment is 800 ms from the deadline it must keep clear of, so a loaded machine's late
  // wake-up does not decide the outcome.
  sender.open(7, in(2000ms));
  frame first = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(first.header, std::move(first.payload)));
  std::this_thread::sleep_for(1200ms);
  receiver.expect(expectation(7, 2000ms));
  sender.ready(7, receiver.endpoint(), receiver.public_key());
  std::this_thread::sleep_for(1200ms);  // past open()'s deadline, inside the reservation's window
  for (int layer = 1; layer < num_layers(); ++layer) {
    frame f = frame_of(7, layer, 1, 0, num_tokens);
    ASSERT_TRUE(sender.send(f.header, std::move(f.payload))) << "layer " << layer;
  }
  sender.finish(7);
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(sent.size(), 0u);
}

TEST_F(kv_plane_test, the_buffer_limit_fails_the_transfer_that_exceeds_it) {
  const size_t frame_bytes = frame_of(7, 0, 1, 0, num_tokens).payload.size();
  kv_channel_settings settings;
  settings.max_buffered_bytes = frame_bytes * 3 / 2;  // one frame fits, two do not
  event_log sent;
  kv_sender sender(settings, sent.sender_events());
  sender.open(7, in(60s));
  sender.open(8, in(60s));
  frame first = frame_of(7, 0, 1, 0, num_tokens), second = frame_of(7, 1, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(first.header, std::move(first.payload)));
  EXPECT_FALSE(sender.send(second.header, std::move(second.payload)));
  const auto failed = sent.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("buffer"), std::string::npos) << failed->why;
  EXPECT_EQ(sender.stats().num_buffered_bytes, 0u);  // transfer 7's first frame went with it
  EXPECT_EQ(sender.stats().num_transfers, 1u);       // 8 is untouched
  frame other = frame_of(8, 0, 1, 0, num_tokens);
  EXPECT_TRUE(sender.send(other.header, std::move(other.payload)));  // the memory is free again
  EXPECT_EQ(sent.count(8), 0u);
}

TEST_F(kv_plane_test, cancel_drops_the_queued_frames_without_an_event) {
  event_log sent;
  kv_sender sender({}, sent.sender_events());
  sender.open(7, in(200ms));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
  sender.cancel(7);
  EXPECT_EQ(sender.stats().num_buffered_bytes, 0u);
  EXPECT_EQ(sender.stats().num_transfers, 0u);
  EXPECT_TRUE(sender.wait_idle(5s));
  // A transfer opened after 7's deadline fails at its own; by then 7's would have come.
  sender.open(8, in(300ms));
  ASSERT_TRUE(sent.wait_for(8));
  EXPECT_EQ(sent.count(7), 0u);
}

// A sender that cannot send a transfer whole gives it up: its queued frames are dropped and the
// receiver, told why, fails the transfer at once, not at its deadline.
TEST_F(kv_plane_test, a_transfer_given_up_fails_at_the_receiver_at_once_with_the_reason) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  receiver.expect(expectation(7, 60s));
  kv_sender sender({}, {});
  sender.open(7, in(60s));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
  sender.give_up(7, request_id, std::string("layer 3 was not sent: the stage went away\n") + std::string(2000, 'x'));
  EXPECT_LE(sender.stats().num_buffered_bytes, kv_frame_reason_max_bytes) << "the queued frame was dropped";
  const auto start = std::chrono::steady_clock::now();
  sender.ready(7, receiver.endpoint(), receiver.public_key());
  const auto done = received.wait_for(7, 10s);
  ASSERT_TRUE(done);
  EXPECT_FALSE(done->completed);
  EXPECT_NE(done->why.find("its sender gave it up: layer 3 was not sent: the stage went away x"), std::string::npos)
      << done->why;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(receiver.stats().num_frames, 0u) << "the frame queued before the give-up never went";
  sender.give_up(99, request_id, "not open");  // nothing
  EXPECT_TRUE(sender.wait_idle(5s));
}

TEST_F(kv_plane_test, a_transfer_not_open_takes_no_frames) {
  kv_sender sender({}, {});
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  EXPECT_FALSE(sender.send(f.header, std::move(f.payload)));
  EXPECT_EQ(sender.stats().num_buffered_bytes, 0u);
  frame lying = frame_of(7, 0, 1, 0, num_tokens);
  lying.header.payload_bytes += 1;
  sender.open(7, in(60s));
  EXPECT_THROW(sender.send(lying.header, std::move(lying.payload)), std::invalid_argument);
  EXPECT_THROW(sender.open(7, in(60s)), std::invalid_argument);
}

TEST_F(kv_plane_test, a_receiver_that_is_gone_fails_the_transfer_at_its_deadline_and_the_sender_closes) {
  std::string endpoint;
  {
    kv_receiver gone(*b_, zmq_channel(), {});
    endpoint = gone.endpoint();
  }
  kv_channel_settings settings = zmq_channel();
  settings.linger = std::chrono::milliseconds(100);
  event_log sent;
  {
    kv_sender sender(settings, sent.sender_events());
    sender.open(7, in(300ms));
    sender.ready(7, endpoint, "");
    send_whole_prompt(sender, 7);
    // Frames are handed to ZeroMQ (it queues them for a peer that may come); the transfer is
    // finished from the sender's side, so no event: the decode side's deadline is what fails it.
    EXPECT_TRUE(sender.wait_idle(10s));
  }  // the destructor returns: linger bounds the wait for a peer that never comes
  EXPECT_EQ(sent.size(), 0u);
}

TEST_F(kv_plane_test, frames_a_dead_peer_cannot_take_are_released_at_the_deadline) {
  // More frames than ZeroMQ queues for a peer that never comes: the rest stay with the sender
  // until the deadline fails the transfer and frees them.
  std::string endpoint;
  {
    kv_receiver gone(*b_, zmq_channel(), {});
    endpoint = gone.endpoint();
  }
  kv_channel_settings settings = zmq_channel();
  settings.linger = std::chrono::milliseconds(100);
  event_log sent;
  kv_sender sender(settings, sent.sender_events());
  sender.open(7, in(500ms));
  sender.ready(7, endpoint, "");
  const int num_frames = 64;
  for (int i = 0; i < num_frames; ++i) {
    frame f = frame_of(7, i % num_layers(), 1, 0, num_tokens);
    ASSERT_TRUE(sender.send(f.header, std::move(f.payload))) << "frame " << i;
  }
  const auto failed = sent.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("deadline"), std::string::npos) << failed->why;
  EXPECT_NE(failed->why.find("frames unsent to " + endpoint), std::string::npos) << failed->why;
  EXPECT_LT(sender.stats().num_frames, uint64_t(num_frames));
  EXPECT_EQ(sender.stats().num_buffered_bytes, 0u);
  EXPECT_EQ(sender.stats().num_transfers, 0u);
  // The socket that took nothing more is closed with what ZeroMQ held for the dead peer.
  EXPECT_EQ(sender.stats().num_destinations, 0u);
}

}  // namespace
}  // namespace troupe::test
