// The KV plane over plain TCP (kv_channel_settings::plain_tcp, kvtransfer/kv_tcp.hpp): the same
// transfers as over ZeroMQ continue bitwise equal, chunk by chunk in order; a frame the receiver
// refuses by its header leaves the connection usable when the stream is still framed, and closes
// it when it is not, after which the sender reconnects; a peer dripping a frame delays no other
// sender; a receiver that is gone fails the transfer by name. Every wait is bounded.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "kvtransfer/kv_tcp.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

kv_channel_settings plain_tcp() {
  kv_channel_settings settings;
  settings.plain_tcp = true;
  settings.allow_direct = false;  // through the socket, although the receiver is in this process
  return settings;
}

// A raw connection to a kvtcp:// receiver, as a broken or hostile sender would write to it.
class raw_peer {
 public:
  explicit raw_peer(const std::string& endpoint) {
    std::string why;
    fd_ = kv_tcp_connect(endpoint, 2s, 1s, why);
    EXPECT_GE(fd_, 0) << why;
  }
  ~raw_peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const std::vector<std::byte>& header, const std::vector<std::byte>& payload) {
    std::string why;
    ASSERT_EQ(kv_tcp_write_frame(fd_, header, payload, std::chrono::steady_clock::now() + 5s, why), kv_tcp_write::done)
        << why;
  }
  // Sends `bytes` one at a time, `gap` apart, until they are all out, the connection fails, or
  // `stop` is set: a peer that keeps a read in progress without ever stalling.
  void drip(const std::vector<std::byte>& bytes, std::chrono::milliseconds gap, const std::atomic<bool>& stop) {
    for (size_t i = 0; i < bytes.size() && !stop; ++i) {
      if (::send(fd_, &bytes[i], 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(gap);
    }
  }
  // Whether the receiver closed this connection, waiting at most `timeout`.
  bool closed_within(std::chrono::milliseconds timeout) {
    return eventually([&] { return kv_tcp_peer_closed(fd_); }, timeout);
  }

 private:
  int fd_ = -1;
};

TEST_F(kv_plane_test, a_transfer_over_plain_tcp_continues_bitwise_equal) {
  event_log received;
  kv_receiver receiver(*b_, plain_tcp(), received.receiver_events());
  ASSERT_TRUE(is_kv_tcp_endpoint(receiver.endpoint())) << receiver.endpoint();
  event_log sent;
  kv_sender sender(plain_tcp(), sent.sender_events());
  receiver.expect(expectation(7));
  sender.open(7, in(60s));
  send_whole_prompt(sender, 7);
  sender.ready(7, receiver.endpoint(), receiver.public_key());
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(receiver.stats().num_frames, uint64_t(num_layers()));
  EXPECT_EQ(receiver.stats().num_refused, 0u);
  EXPECT_TRUE(sender.wait_idle(10s));
  EXPECT_EQ(sender.stats().num_destinations, 1u);  // the connection is kept
  EXPECT_EQ(sent.size(), 0u);

  // A second transfer on the same connection, chunk by chunk as a chunked prefill sends it.
  receiver.expect(expectation(8));
  sender.open(8, in(60s));
  sender.ready(8, receiver.endpoint(), "");
  for (auto [begin, end] : {std::pair{0, 4}, std::pair{4, 8}, std::pair{8, 11}}) {
    for (int layer = 0; layer < num_layers(); ++layer) {
      frame f = frame_of(8, layer, 1, begin, end);
      ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
    }
  }
  sender.finish(8);
  const auto second = received.wait_for(8);
  ASSERT_TRUE(second);
  EXPECT_TRUE(second->completed) << second->why;
  EXPECT_EQ(decode_on_b(), expected_);
}

TEST_F(kv_plane_test, over_plain_tcp_a_framed_refusal_keeps_the_connection_and_a_broken_header_closes_it) {
  event_log received;
  kv_receiver receiver(*b_, plain_tcp(), received.receiver_events());
  receiver.expect(expectation(7));
  raw_peer peer(receiver.endpoint());
  // A late frame of a transfer the receiver does not expect: counted, payload skipped unread.
  const frame unknown = frame_of(99, 0, 1, 0, num_tokens);
  peer.write(unknown.header_bytes(), unknown.payload);
  // Then a good frame on the same connection is taken.
  const frame good = frame_of(7, 0, 1, 0, num_tokens);
  peer.write(good.header_bytes(), good.payload);
  ASSERT_TRUE(eventually([&] { return receiver.stats().num_frames == 1; }, 10s)) << receiver.stats().last_refusal;
  EXPECT_EQ(receiver.stats().num_refused, 1u);
  EXPECT_NE(receiver.stats().last_refusal.find("transfer 99"), std::string::npos) << receiver.stats().last_refusal;
  EXPECT_FALSE(peer.closed_within(100ms));
  // A header that is not one: nothing after it can be framed, so the connection is closed.
  std::vector<std::byte> garbage = good.header_bytes();
  garbage[0] = std::byte{0};
  peer.write(garbage, good.payload);
  EXPECT_TRUE(peer.closed_within(10s));
  EXPECT_EQ(receiver.stats().num_refused, 2u);
  EXPECT_NE(receiver.stats().last_refusal.find("bad magic"), std::string::npos) << receiver.stats().last_refusal;
  EXPECT_EQ(receiver.stats().num_expected, 1u);  // transfer 7 is still expected: nothing failed it
}

// A frame's bytes must all arrive by a deadline, not only without a stall: a peer dripping a
// valid header a byte at a time is cut off, and cannot hold the receiver's shutdown (issue 25).
TEST_F(kv_plane_test, over_plain_tcp_a_dripping_peer_is_cut_off_and_cannot_hold_the_shutdown) {
  event_log received;
  auto receiver = std::make_unique<kv_receiver>(*b_, plain_tcp(), received.receiver_events());
  receiver->expect(expectation(7));
  const std::vector<std::byte> header = frame_of(7, 0, 1, 0, num_tokens).header_bytes();
  std::atomic<bool> stop{false};
  {
    raw_peer peer(receiver->endpoint());
    std::thread dripping([&] { peer.drip(header, 100ms, stop); });  // 64 bytes: 6.4 s
    const bool closed = peer.closed_within(4s);
    stop = true;
    dripping.join();
    EXPECT_TRUE(closed) << "a header dripped a byte every 100 ms was read on";
  }
  stop = false;
  raw_peer peer(receiver->endpoint());
  std::thread dripping([&] { peer.drip(header, 100ms, stop); });
  std::this_thread::sleep_for(300ms);  // the receiver is inside the header now
  const auto start = std::chrono::steady_clock::now();
  receiver.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  dripping.join();
  EXPECT_LT(took, 800ms) << "the shutdown waited "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms for the dripping peer";
}

// Each sender's connection is read on its own: while a peer drips a frame (a byte every 100 ms,
// cut off only at its read deadline, ~1 s), another sender's frame is taken at once. With one
// thread reading every connection, that frame waited for the dripper's deadline (issue 25).
TEST_F(kv_plane_test, over_plain_tcp_a_dripping_peer_delays_no_other_sender) {
  event_log received;
  kv_receiver receiver(*b_, plain_tcp(), received.receiver_events());
  receiver.expect(expectation(7));
  receiver.expect(expectation(8));
  const std::vector<std::byte> dripped = frame_of(8, 0, 1, 0, num_tokens).header_bytes();
  std::atomic<bool> stop{false};
  raw_peer dripper(receiver.endpoint());
  std::thread dripping([&] { dripper.drip(dripped, 100ms, stop); });
  std::this_thread::sleep_for(250ms);  // the receiver is inside the dripped header now
  raw_peer sender(receiver.endpoint());
  const frame good = frame_of(7, 0, 1, 0, num_tokens);
  const auto start = std::chrono::steady_clock::now();
  sender.write(good.header_bytes(), good.payload);
  const bool taken = eventually([&] { return receiver.stats().num_frames == 1; }, 5s);
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  dripping.join();
  ASSERT_TRUE(taken) << receiver.stats().last_refusal;
  EXPECT_LT(took, 400ms) << "the frame waited " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms behind a dripping peer";
}

TEST_F(kv_plane_test, over_plain_tcp_a_sender_reconnects_after_the_receiver_closed_its_connection) {
  event_log received;
  kv_receiver receiver(*b_, plain_tcp(), received.receiver_events());
  event_log sent;
  kv_sender sender(plain_tcp(), sent.sender_events());
  // A frame whose header does not hold together (num_blocks does not cover its tokens): the
  // receiver cannot trust its framing and closes the connection.
  receiver.expect(expectation(7));
  sender.open(7, in(60s));
  sender.ready(7, receiver.endpoint(), "");
  frame broken = frame_of(7, 0, 1, 0, num_tokens);
  broken.header.span.num_blocks += 1;
  ASSERT_TRUE(sender.send(broken.header, std::move(broken.payload)));
  ASSERT_TRUE(eventually([&] { return receiver.stats().num_refused == 1; }, 10s));
  EXPECT_NE(receiver.stats().last_refusal.find("num_blocks"), std::string::npos) << receiver.stats().last_refusal;
  sender.cancel(7);
  receiver.cancel(7);
  // The next transfer finds the connection closed (on loopback the receiver's FIN is there as
  // soon as it closed), connects again, and completes.
  receiver.expect(expectation(8));
  sender.open(8, in(60s));
  send_whole_prompt(sender, 8);
  sender.ready(8, receiver.endpoint(), "");
  const auto done = received.wait_for(8);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(sent.count(8), 0u);
}

TEST_F(kv_plane_test, over_plain_tcp_a_receiver_that_is_gone_fails_the_transfer_by_name) {
  std::string endpoint;
  {
    kv_receiver gone(*b_, plain_tcp(), {});
    endpoint = gone.endpoint();
  }  // closed: nothing listens there any more
  event_log sent;
  kv_sender sender(plain_tcp(), sent.sender_events());
  sender.open(7, in(60s));
  sender.ready(7, endpoint, "");
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
  const auto failed = sent.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("cannot connect to " + endpoint), std::string::npos) << failed->why;
  EXPECT_EQ(sender.stats().num_transfers, 0u);
}

}  // namespace
}  // namespace troupe::test
