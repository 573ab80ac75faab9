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
  kv_receiver receiver(*b_, zmq_channel(), received.receiver_events());
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
  EXPECT_EQ(sender.stats().num_transfers, 0u);     // finished and sent: closed
  EXPECT_EQ(sender.stats().num_destinations, 1u);  // the socket is kept for the next transfer
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

TEST_F(kv_plane_test, a_chunked_prefill_through_the_socket_arrives_in_the_order_queued) {
  // Chunk by chunk, layer by layer, as a chunked prefill exports: [0, 4), [4, 8), [8, 11) of
  // every layer. A chunk overtaking the one before it would leave a gap and fail the transfer.
  event_log received;
  kv_receiver receiver(*b_, zmq_channel(), received.receiver_events());
  kv_channel_settings settings;
  settings.allow_direct = false;
  kv_sender sender(settings, {});
  receiver.expect(expectation(7));
  sender.open(7, in(60s));
  sender.ready(7, receiver.endpoint(), "");
  for (auto [begin, end] : {std::pair{0, 4}, std::pair{4, 8}, std::pair{8, 11}}) {
    for (int layer = 0; layer < num_layers(); ++layer) {
      frame f = frame_of(7, layer, 1, begin, end);
      ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
    }
  }
  sender.finish(7);
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(receiver.stats().num_frames, uint64_t(3 * num_layers()));
  EXPECT_EQ(decode_on_b(), expected_);
}

// The control path of a device transport: the bytes went device to device, the sender queues
// in-place frames (no payload) through the socket, and they complete the receiver's lease.
TEST_F(kv_plane_test, in_place_frames_through_the_socket_complete_an_in_place_transfer) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  kv_channel_settings settings;
  settings.allow_direct = false;
  kv_sender sender(settings, {});
  kv_expectation e = expectation(7);
  e.in_place = true;
  receiver.expect(e);
  sender.open(7, in(60s));
  sender.ready(7, receiver.endpoint(), "");
  for (int layer = 0; layer < num_layers(); ++layer) {
    frame f = frame_of(7, layer, 1, 0, num_tokens);
    f.header.in_place = true;
    f.header.payload_bytes = 0;
    ASSERT_TRUE(sender.send(f.header, {}));
  }
  sender.finish(7);
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(receiver.stats().num_frames, uint64_t(num_layers()));
  EXPECT_EQ(receiver.stats().num_bytes, 0u);
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

// Refusals: each frame is handed over synchronously (the direct path runs the same checks as
// the socket), so the receiver's state is known right after each.
class kv_receiver_refusals : public kv_plane_test {
 protected:
  void SetUp() override {
    kv_plane_test::SetUp();
    if (IsSkipped()) return;
    receiver_ = std::make_unique<kv_receiver>(*b_, zmq_channel(), log_.receiver_events());
    pool_before_ = whole_pool_of_b();
  }

  // Delivers `f` (its header as given, the payload as given) and checks it was refused for a
  // reason naming `field`, that B's pool is unchanged, and whether the transfer failed.
  void expect_refused(const std::vector<std::byte>& header, const std::vector<std::byte>& payload,
                      const std::string& field, uint64_t transfer_id, bool fails_the_transfer) {
    const kv_receiver_stats before = receiver_->stats();
    const size_t num_events = log_.size();
    ASSERT_TRUE(deliver_to_local_receiver(receiver_->endpoint(), header, payload));
    const kv_receiver_stats after = receiver_->stats();
    EXPECT_EQ(after.num_refused, before.num_refused + 1) << field;
    EXPECT_NE(after.last_refusal.find(field), std::string::npos) << after.last_refusal << " does not name " << field;
    EXPECT_EQ(after.num_frames, before.num_frames) << field;
    EXPECT_EQ(whole_pool_of_b(), pool_before_) << "a refused frame (" << field << ") was imported";
    if (fails_the_transfer) {
      const auto event = log_.wait_for(transfer_id, 0ms);
      ASSERT_TRUE(event) << "a bad frame (" << field << ") of an expected transfer did not fail it";
      EXPECT_FALSE(event->completed);
      EXPECT_NE(event->why.find(field), std::string::npos) << event->why;
      EXPECT_EQ(after.num_expected, before.num_expected - 1) << "the failed transfer's lease was kept";
    } else {
      EXPECT_EQ(log_.size(), num_events) << field;
      EXPECT_EQ(after.num_expected, before.num_expected) << field;
    }
  }
  void expect_refused(const frame& f, const std::string& field, bool fails_the_transfer = true) {
    expect_refused(f.header_bytes(), f.payload, field, f.header.transfer_id, fails_the_transfer);
  }

  event_log log_;
  std::unique_ptr<kv_receiver> receiver_;
  std::vector<std::byte> pool_before_;
};

TEST_F(kv_receiver_refusals, a_frame_of_an_unknown_transfer_is_counted_and_fails_nothing) {
  receiver_->expect(expectation(7));
  expect_refused(frame_of(99, 0, 1, 0, num_tokens), "transfer 99", false);
  EXPECT_EQ(receiver_->stats().num_expected, 1u);  // transfer 7 is still expected
}

TEST_F(kv_receiver_refusals, a_frame_naming_another_request_fails_its_transfer) {
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  f.header.request_id = request_id + 1;
  expect_refused(f, "request 43");
  // The transfer is gone: its next frame, even a good one, is refused as unknown.
  expect_refused(frame_of(7, 0, 1, 0, num_tokens), "not expected", false);
}

TEST_F(kv_receiver_refusals, wrong_layer_counts_are_refused) {
  // stories260K has 5 layers; a frame claiming layers [4, 6) is consistent in itself (its
  // payload has two layers' bytes) but lies outside the model.
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 2, 0, num_tokens);
  f.header.span.first_layer = num_layers() - 1;
  expect_refused(f, "layer range first " + std::to_string(num_layers() - 1) + " count 2");
  receiver_->expect(expectation(8));
  frame none = frame_of(8, 0, 1, 0, num_tokens);
  none.header.span.num_layers = 0;  // refused by the header check alone: transfer 8 stays
  expect_refused(none, "layer range", false);
  frame too_many = frame_of(8, 0, 1, 0, num_tokens);
  too_many.header.span.num_layers = num_layers() + 1;  // the payload no longer matches the span
  expect_refused(too_many, "payload_bytes", false);
}

TEST_F(kv_receiver_refusals, a_gap_in_the_token_range_is_refused) {
  receiver_->expect(expectation(7));
  expect_refused(frame_of(7, 0, 1, 4, num_tokens), "token_begin 4 of layer 0 leaves a gap");
  // With tokens [0, 4) of layer 0 in, [4, 11) continues it; [8, 11) of layer 1 is a gap.
  receiver_->expect(expectation(8));
  const frame first = frame_of(8, 0, 1, 0, 4);
  ASSERT_TRUE(deliver_to_local_receiver(receiver_->endpoint(), first.header_bytes(), first.payload));
  pool_before_ = whole_pool_of_b();
  expect_refused(frame_of(8, 0, 2, 8, num_tokens), "token_begin 8 of layer 0");
}

TEST_F(kv_receiver_refusals, tokens_past_the_transfer_are_refused) {
  kv_expectation shorter = expectation(7);
  shorter.num_tokens = 8;
  receiver_->expect(shorter);
  expect_refused(frame_of(7, 0, 1, 0, num_tokens), "token_end 11");
}

TEST_F(kv_receiver_refusals, a_payload_that_is_not_the_announced_size_is_refused) {
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  std::vector<std::byte> shorter(f.payload.begin(), f.payload.end() - 1);
  expect_refused(f.header_bytes(), shorter, "the payload has " + std::to_string(shorter.size()), 7, true);
  receiver_->expect(expectation(8));
  frame g = frame_of(8, 0, 1, 0, num_tokens);
  g.payload.push_back(std::byte{1});
  expect_refused(g, "the payload has " + std::to_string(g.payload.size()));
}

TEST_F(kv_receiver_refusals, a_header_that_lies_about_its_own_size_is_refused_unread) {
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  f.header.payload_bytes = uint64_t(1) << 40;  // the payload as sent; only the header lies
  expect_refused(f, "payload_bytes", false);
}

// A device transport (CUDA IPC, NCCL) writes the blocks itself and sends in-place frames over
// the socket: the receiver keeps the lease's books from them and imports nothing.
TEST_F(kv_receiver_refusals, in_place_frames_complete_an_in_place_transfer_without_an_import) {
  kv_expectation e = expectation(7);
  e.in_place = true;
  receiver_->expect(e);
  for (int layer = 0; layer < num_layers(); ++layer) {
    frame f = frame_of(7, layer, 1, 0, num_tokens);
    f.header.in_place = true;
    f.header.payload_bytes = 0;
    ASSERT_TRUE(deliver_to_local_receiver(receiver_->endpoint(), f.header_bytes(), {}));
    EXPECT_EQ(log_.size(), layer + 1 == num_layers() ? 1u : 0u) << "after layer " << layer;
  }
  const auto done = log_.wait_for(7, 0ms);
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(whole_pool_of_b(), pool_before_) << "an in-place frame was imported";
  EXPECT_EQ(receiver_->stats().num_expected, 0u);
}

TEST_F(kv_receiver_refusals, in_place_frames_are_refused_for_a_transfer_that_expects_bytes) {
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  f.header.in_place = true;
  f.header.payload_bytes = 0;
  expect_refused(f.header_bytes(), {}, "written in place", 7, true);
  // And the other way: bytes for a transfer a device transport fills.
  kv_expectation e = expectation(8);
  e.in_place = true;
  receiver_->expect(e);
  expect_refused(frame_of(8, 0, 1, 0, num_tokens), "expects its KV written in place");
}

TEST_F(kv_receiver_refusals, another_geometry_is_refused) {
  receiver_->expect(expectation(7));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  f.header.span.head_dim /= 2;
  f.header.span.num_kv_heads *= 2;  // the same bytes, another shape
  expect_refused(f, "geometry");
}

TEST_F(kv_receiver_refusals, a_bad_magic_is_refused_and_fails_nothing) {
  receiver_->expect(expectation(7));
  const frame f = frame_of(7, 0, 1, 0, num_tokens);
  std::vector<std::byte> header = f.header_bytes();
  header[0] = std::byte{0};
  expect_refused(header, f.payload, "magic", 7, false);
}

TEST_F(kv_receiver_refusals, the_socket_refuses_messages_of_the_wrong_shape) {
  receiver_->expect(expectation(7));
  const frame f = frame_of(7, 0, 1, 0, num_tokens);
  zmq::context_t context(1);
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 1000);
  push.connect(receiver_->endpoint());
  const std::vector<std::byte> header = f.header_bytes();
  push.send(zmq::buffer(header), zmq::send_flags::none);  // one part
  push.send(zmq::buffer(header), zmq::send_flags::sndmore);
  push.send(zmq::buffer(f.payload), zmq::send_flags::sndmore);
  push.send(zmq::buffer(f.payload), zmq::send_flags::none);  // three parts
  std::vector<std::byte> shorter(f.payload.begin(), f.payload.end() - 8);
  push.send(zmq::buffer(header), zmq::send_flags::sndmore);
  push.send(zmq::buffer(shorter), zmq::send_flags::none);  // a lying size: fails transfer 7
  ASSERT_TRUE(eventually([&] { return receiver_->stats().num_refused >= 3; })) << receiver_->stats().last_refusal;
  const auto failed = log_.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("payload_bytes"), std::string::npos) << failed->why;
  EXPECT_EQ(receiver_->stats().num_frames, 0u);
  EXPECT_EQ(whole_pool_of_b(), pool_before_);
}

TEST_F(kv_receiver_refusals, a_message_above_the_size_limit_is_dropped_by_zeromq_unread) {
  // A receiver whose frames may carry at most 1 KiB: a bigger message breaks the connection
  // before ZeroMQ allocates it, so nothing arrives; the same sender's small frames did.
  kv_channel_settings small = zmq_channel();
  small.max_payload_bytes = 1024;
  event_log log;
  kv_receiver receiver(*b_, small, log.receiver_events());
  receiver.expect(expectation(7));
  const frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_GT(f.payload.size(), small.max_payload_bytes);
  zmq::context_t context(1);
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 1000);
  push.connect(receiver.endpoint());
  const std::vector<std::byte> header = f.header_bytes();
  push.send(zmq::buffer(header), zmq::send_flags::none);  // small: arrives (refused: one part)
  ASSERT_TRUE(eventually([&] { return receiver.stats().num_refused == 1; }));
  push.send(zmq::buffer(header), zmq::send_flags::sndmore);
  push.send(zmq::buffer(f.payload), zmq::send_flags::none);
  // Nothing to wait for that would arrive: the transfer's deadline is the bound.
  receiver.cancel(7);
  receiver.expect(expectation(8, 300ms));
  ASSERT_TRUE(log.wait_for(8));
  EXPECT_EQ(receiver.stats().num_refused, 1u);
  EXPECT_EQ(receiver.stats().num_frames, 0u);
  EXPECT_EQ(whole_pool_of_b(), pool_before_);
}

TEST_F(kv_receiver_refusals, expectations_that_do_not_fit_the_pool_are_refused_by_name) {
  auto expect_invalid = [&](kv_expectation e, const std::string& field) {
    try {
      receiver_->expect(std::move(e));
      ADD_FAILURE() << "accepted, expected a refusal naming " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  };
  kv_expectation e = expectation(7);
  e.block_ids = {0, 11};
  expect_invalid(e, "2 block_ids for 11 tokens");
  e.block_ids = {0, 11, 16};
  expect_invalid(e, "block id 16");
  e.block_ids = {0, 11, 0};
  expect_invalid(e, "block id 0 appears twice");
  e = expectation(7);
  e.num_tokens = 0;
  expect_invalid(e, "num_tokens 0");
  receiver_->expect(expectation(7));
  expect_invalid(expectation(7), "already expected");
  EXPECT_EQ(receiver_->stats().num_expected, 1u);
}

TEST_F(kv_plane_test, a_deadline_fails_the_transfer_once_and_releases_it) {
  event_log log;
  kv_receiver receiver(*b_, {}, log.receiver_events());
  receiver.expect(expectation(7, 100ms));
  const frame first = frame_of(7, 0, 1, 0, num_tokens);  // one layer of five arrives in time
  ASSERT_TRUE(deliver_to_local_receiver(receiver.endpoint(), first.header_bytes(), first.payload));
  const auto failed = log.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_FALSE(failed->completed);
  EXPECT_NE(failed->why.find("deadline"), std::string::npos) << failed->why;
  EXPECT_NE(failed->why.find("layer 1 at 0 of 11"), std::string::npos) << failed->why;
  EXPECT_EQ(receiver.stats().num_expected, 0u);
  const std::vector<std::byte> pool = whole_pool_of_b();
  const frame late = frame_of(7, 1, 1, 0, num_tokens);
  ASSERT_TRUE(deliver_to_local_receiver(receiver.endpoint(), late.header_bytes(), late.payload));
  EXPECT_EQ(whole_pool_of_b(), pool) << "a frame after the deadline was imported";
  EXPECT_EQ(receiver.stats().num_refused, 1u);
  // Another expectation's deadline passing later (the thread is past 7's) proves no second event.
  receiver.expect(expectation(8, 50ms));
  ASSERT_TRUE(log.wait_for(8));
  EXPECT_EQ(log.count(7), 1u);
}

TEST_F(kv_plane_test, cancel_releases_the_transfer_without_an_event) {
  event_log log;
  kv_receiver receiver(*b_, {}, log.receiver_events());
  receiver.expect(expectation(7, 100ms));
  receiver.cancel(7);
  receiver.cancel(12345);  // unknown: nothing
  EXPECT_EQ(receiver.stats().num_expected, 0u);
  const std::vector<std::byte> pool = whole_pool_of_b();
  const frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(deliver_to_local_receiver(receiver.endpoint(), f.header_bytes(), f.payload));
  EXPECT_EQ(whole_pool_of_b(), pool);
  // Past 7's deadline (8's fired later on the same thread): 7 never got one.
  receiver.expect(expectation(8, 200ms));
  ASSERT_TRUE(log.wait_for(8));
  EXPECT_EQ(log.count(7), 0u);
  receiver.expect(expectation(7));  // the id may be used again
}

}  // namespace
}  // namespace troupe::test
