// kv_transport "nccl" served, checked on the CPU: kv_layer_streamer with nccl_kv_copier on the
// prefill side, kv_receiver with nccl_kv_inbox on the decode side, and between them pair links
// that pair sends and receives in memory the way NCCL does (tests/kvtransfer/memory_pair_links.hpp),
// moving blocks between two stories260K pools. The in-place frames go through a real kv_sender
// and the receiver's lease; the pair's id goes in the handle as it would in the kv_ready_msg.
// The NCCL channel itself is checked on GPUs (tests/backends/cuda/gpu_kv_transports_test.cpp,
// disagg_nccl_test.cpp).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/kv_layer_streamer.hpp"
#include "kvtransfer/nccl_kv_copier.hpp"
#include "kvtransfer/nccl_kv_inbox.hpp"
#include "kvtransfer/nccl_pool_handle.hpp"
#include "tests/kvtransfer/kv_stream_steps.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"
#include "tests/kvtransfer/memory_pair_links.hpp"

namespace troupe::test {
namespace {

constexpr const char* prefill_peer = "prefill KV agent 1@a";

class kv_layer_streamer_nccl : public kv_plane_test {
 protected:
  void SetUp() override {
    kv_plane_test::SetUp();
    if (IsSkipped()) return;
    links_ = fabric_.links(*a_, *b_);
    copier_ = std::make_shared<nccl_kv_copier>(geometry(), links_);
    destinations_ = std::make_shared<kv_device_destinations>();
    inbox_ = std::make_shared<nccl_kv_inbox>(geometry(), links_);
    receiver_ = std::make_unique<kv_receiver>(*b_, kv_channel_settings{}, received_.receiver_events(), inbox_);
  }

  void TearDown() override {
    receiver_.reset();  // closes the inbox: its threads end before the models go
    inbox_.reset();
  }

  // Both pools' geometry as a device pool would describe it (the memory links do not read base).
  device_kv_pool geometry() const {
    const kv_cache_shape shape = a_->kv_shape();
    const size_t block_bytes =
        static_cast<size_t>(shape.block_size) * a_->config().num_kv_heads * a_->config().head_dim * 4;
    return device_kv_pool{0, nullptr, num_layers(), shape.num_blocks, block_bytes, dtype::f32};
  }

  // The decode side's half of a transfer from `peer`: the expectation (what its KV agent does on
  // kv_expect_msg) and the destination the prefill worker's agent keeps from the kv_ready_msg.
  nccl_kv_inbox::handle expect(uint64_t transfer_id, const std::string& peer, std::chrono::milliseconds timeout = 10s) {
    nccl_kv_inbox::handle h = inbox_->handle_for(peer);
    kv_expectation e = expectation(transfer_id, timeout);
    e.in_place = true;
    e.device_pair = h.pair_id;
    receiver_->expect(e);
    destinations_->put(transfer_id, kv_device_destination{h.bytes, blocks_b}, in(timeout));
    return h;
  }

  void stream(kv_layer_streamer& out, const std::vector<int>& cuts) {
    stream_prompt(out, request_id, kv_transfer_prompt, blocks_a, cuts, num_layers());
  }

  // A whole transfer, prefill to decode, in the chunks `cuts` names; the decode side's logits.
  void transfer_and_check(uint64_t transfer_id, const std::vector<int>& cuts) {
    expect(transfer_id, prefill_peer);
    kv_sender sender({}, {});
    // 10 s: ample for a few milliseconds of work, and what a hang (a send posted before its
    // frame: the receiver never joins) costs before the test fails.
    kv_layer_streamer out(*a_, sender, 10s, kv_device_path{copier_, destinations_});
    out.start(request_id, transfer_id);
    sender.ready(transfer_id, receiver_->endpoint(), "");
    stream(out, cuts);
    const auto done = received_.wait_for(transfer_id);
    ASSERT_TRUE(done) << receiver_->stats().last_refusal;
    EXPECT_TRUE(done->completed) << done->why;
    EXPECT_EQ(receiver_->stats().num_bytes, 0u) << "the frames must be in place";
    EXPECT_EQ(decode_on_b(), expected_) << "the decode side must continue bitwise as the prefill side would";
    EXPECT_EQ(receiver_->stats().num_expected, 0u);
    out.forget(request_id, false);
    EXPECT_TRUE(eventually([&] { return sender.stats().num_transfers == 0; }));
  }

  memory_pair_fabric fabric_;
  std::shared_ptr<kv_pair_links> links_;
  std::shared_ptr<nccl_kv_copier> copier_;
  std::shared_ptr<kv_device_destinations> destinations_;
  event_log received_;
  std::shared_ptr<nccl_kv_inbox> inbox_;
  std::unique_ptr<kv_receiver> receiver_;
};

TEST_F(kv_layer_streamer_nccl, a_whole_prompt_lands_in_the_reserved_blocks_and_the_decode_continues_bitwise) {
  transfer_and_check(7, {0, num_tokens});
  EXPECT_EQ(inbox_->num_pairs(), 1u);
  EXPECT_EQ(copier_->num_pairs(), 1u);
}

TEST_F(kv_layer_streamer_nccl, a_chunked_prefill_sends_chunk_by_chunk_over_one_pair) {
  transfer_and_check(8, {0, 6, num_tokens});
  EXPECT_EQ(receiver_->stats().num_frames, uint64_t(2 * num_layers()));
}

// The first step computes only the tokens after the cached prefix; the cached blocks go out with it.
TEST_F(kv_layer_streamer_nccl, prefix_cache_blocks_are_sent_with_the_first_chunk) {
  transfer_and_check(9, {8, num_tokens});
}

// NCCL's receiver posts its receive when the in-place frame arrives: a send posted before its
// frame was queued would wait for a receive that never comes. With rendezvous sends, a send
// posted before the receiver had the frame fails.
TEST_F(kv_layer_streamer_nccl, each_layers_frame_goes_before_its_data) {
  fabric_.rendezvous = true;
  transfer_and_check(10, {0, 6, num_tokens});
}

// Two transfers from one peer in one step: their sends are posted interleaved (T1 layer 0, T2
// layer 0, T1 layer 1, ...), but the sender hands over T2's frames first (T1's destination is
// known later). The receiver posts its receives in the frames' sequence, not their arrival
// order: posted in arrival order, T2's 2-block receive would meet T1's 3-block send.
TEST_F(kv_layer_streamer_nccl, frames_that_arrive_out_of_order_are_received_in_the_order_the_sends_were_posted) {
  // A transfer first, so that the pair is joined: a first send waits for the join, which the
  // receiver makes at its first frame, and that would put the frames back in order.
  transfer_and_check(19, {0, num_tokens});
  const std::vector<int32_t> blocks_b2 = {1, 3};  // T2: the prompt's first 8 tokens, 2 whole blocks
  const nccl_kv_inbox::handle h = inbox_->handle_for(prefill_peer);
  kv_expectation e1 = expectation(20, 10s);
  e1.in_place = true;
  e1.device_pair = h.pair_id;
  receiver_->expect(e1);
  kv_expectation e2{21, request_id + 1, blocks_b2, 8, in(10s), true, h.pair_id};
  receiver_->expect(e2);
  destinations_->put(20, kv_device_destination{h.bytes, blocks_b}, in(10s));
  destinations_->put(21, kv_device_destination{h.bytes, blocks_b2}, in(10s));
  kv_sender sender({}, {});
  kv_layer_streamer out(*a_, sender, 10s, kv_device_path{copier_, destinations_});
  out.start(request_id, 20);
  out.start(request_id + 1, 21);
  sender.ready(21, receiver_->endpoint(), "");
  std::thread late_ready([&] {
    std::this_thread::sleep_for(300ms);  // T2's frames are all out by then
    sender.ready(20, receiver_->endpoint(), "");
  });
  step_plan plan = prefill_step(request_id, kv_transfer_prompt, blocks_a, 0, num_tokens, true);
  const std::vector<int32_t> blocks_a2(blocks_a.begin(), blocks_a.begin() + 2);
  plan.sequences.push_back(prefill_step(request_id + 1, kv_transfer_prompt, blocks_a2, 0, 8, true).sequences[0]);
  ASSERT_TRUE(out.prepare(plan, {&blocks_a, &blocks_a2}));
  for (int layer = 0; layer < num_layers(); ++layer) out.on_layer_written(layer);
  out.finish_step();  // waits for every send: T1's only once its frames arrived
  late_ready.join();
  for (uint64_t id : {20u, 21u}) {
    const auto done = received_.wait_for(id);
    ASSERT_TRUE(done) << receiver_->stats().last_refusal;
    EXPECT_TRUE(done->completed) << "transfer " << id << ": " << done->why;
  }
  EXPECT_EQ(decode_on_b(), expected_);
  // T2's blocks hold A's KV of its tokens, every layer, byte for byte.
  const kv_span_header all = kv_span_for(a_->config(), a_->kv_shape(), 2, 0, num_layers(), dtype::f32);
  std::vector<std::byte> from_a(kv_span_bytes(all)), in_b(kv_span_bytes(all));
  a_->export_kv(blocks_a2, 0, num_layers(), dtype::f32, from_a);
  b_->export_kv(blocks_b2, 0, num_layers(), dtype::f32, in_b);
  EXPECT_TRUE(from_a == in_b) << "T2's blocks hold another transfer's KV";
  out.forget(request_id, false);
  out.forget(request_id + 1, false);
}

// Two transfers from one peer reuse its pair; the next peer gets a pair (and an id) of its own.
TEST_F(kv_layer_streamer_nccl, a_second_prefill_peer_gets_its_own_id_and_a_peer_keeps_its_pair) {
  const nccl_kv_inbox::handle first = inbox_->handle_for(prefill_peer);
  EXPECT_EQ(inbox_->handle_for(prefill_peer).pair_id, first.pair_id);
  const nccl_kv_inbox::handle second = inbox_->handle_for("prefill KV agent 1@b (restarted)");
  EXPECT_NE(second.pair_id, first.pair_id);
  EXPECT_EQ(inbox_->num_pairs(), 2u);
  // The handle names the id and this pool's geometry, as the prefill side reads it.
  const nccl_pool_handle decoded = decode_nccl_pool_handle(second.bytes);
  EXPECT_EQ(decoded.pair_id, second.pair_id);
  EXPECT_EQ(decoded.geometry.num_blocks, b_->kv_shape().num_blocks);
  EXPECT_THROW(inbox_->handle_for(""), std::invalid_argument);
  transfer_and_check(11, {0, num_tokens});
}

// A prefill peer whose data never comes: the decode side's receive gives up at the transfer's
// deadline and fails it, no lease is left on either side, and the pair is dropped.
TEST_F(kv_layer_streamer_nccl,
       a_peer_that_never_sends_its_data_fails_the_transfer_at_its_deadline_and_leaves_no_lease) {
  fabric_.drop_sends = true;
  expect(12, prefill_peer, 500ms);
  kv_sender sender({}, {});
  kv_layer_streamer out(*a_, sender, 500ms, kv_device_path{copier_, destinations_});
  out.start(request_id, 12);
  sender.ready(12, receiver_->endpoint(), "");
  stream(out, {0, num_tokens});  // finish_step waits for the sends, bounded by the deadline
  const auto done = received_.wait_for(12);
  ASSERT_TRUE(done);
  EXPECT_FALSE(done->completed);
  EXPECT_EQ(received_.count(12), 1u) << "exactly one outcome per lease";
  EXPECT_EQ(receiver_->stats().num_expected, 0u);
  out.forget(request_id, false);
  EXPECT_TRUE(eventually([&] { return sender.stats().num_transfers == 0; }));
  EXPECT_TRUE(eventually([&] { return inbox_->num_pairs() == 0; })) << "the broken pair must be dropped";
  EXPECT_EQ(copier_->num_pairs(), 0u) << "the prefill side must drop its broken pair too";
}

// cancel() keeps the receiver's promise: once it returns, nothing writes into the blocks the
// scheduler takes back, although a receive was posted for them and the peer's data comes later.
TEST_F(kv_layer_streamer_nccl, cancel_while_a_receive_is_in_flight_leaves_no_write_after_it_returns) {
  fabric_.drop_sends = true;  // the prefill side's own sends never arrive: the receive stays posted
  const nccl_kv_inbox::handle h = expect(13, prefill_peer);
  kv_sender sender({}, {});
  kv_layer_streamer out(*a_, sender, 60s, kv_device_path{copier_, destinations_});
  out.start(request_id, 13);
  sender.ready(13, receiver_->endpoint(), "");
  ASSERT_TRUE(out.prepare(prefill_step(request_id, kv_transfer_prompt, blocks_a, 0, num_tokens, true), {&blocks_a}));
  out.on_layer_written(0);  // the frame of layer 0, then its (lost) send
  ASSERT_TRUE(eventually([&] { return fabric_.num_waiting_receives(h.pair_id) == 1; }))
      << "the decode side never posted the receive of layer 0";
  const std::vector<std::byte> before = whole_pool_of_b();
  receiver_->cancel(13);
  // The peer's data, late: nothing may land in the cancelled transfer's blocks.
  fabric_.send_after(h.pair_id, *a_, std::vector<int32_t>(blocks_a.begin(), blocks_a.end()), 0);
  EXPECT_EQ(fabric_.num_sends_delivered(h.pair_id), 0u);
  EXPECT_TRUE(whole_pool_of_b() == before) << "the late data was written into the cancelled transfer's blocks";
  EXPECT_EQ(received_.count(13), 0u) << "a cancel fires no event";
  EXPECT_EQ(receiver_->stats().num_expected, 0u);
  EXPECT_EQ(inbox_->num_pairs(), 0u) << "the pair is out of step after a cancel: dropped";
  out.forget(request_id, false);
}

// After a pair broke, the peer's next transfer gets a new id and a new channel on both sides, and
// a transfer still naming the broken id fails at once on the prefill side instead of waiting for
// a join that never comes.
TEST_F(kv_layer_streamer_nccl, a_broken_pair_is_replaced_by_a_new_one) {
  const nccl_kv_inbox::handle old = inbox_->handle_for(prefill_peer);
  inbox_->end(old.pair_id, "the test broke it");
  EXPECT_EQ(inbox_->num_pairs(), 0u);
  EXPECT_THROW(copier_->copy_to(old.bytes, {blocks_a.data(), 1}, {blocks_b.data(), 1}, 0, 1, in(200ms)),
               std::runtime_error);  // the decode side never joins a broken pair
  EXPECT_THROW(copier_->copy_to(old.bytes, {blocks_a.data(), 1}, {blocks_b.data(), 1}, 0, 1, in(60s)),
               std::runtime_error);  // and the id is known dead: refused at once, not at the deadline
  transfer_and_check(14, {0, num_tokens});
  EXPECT_NE(inbox_->handle_for(prefill_peer).pair_id, old.pair_id);
}

// An nccl transfer's frames must say where they stand in the pair's order, and others must not:
// either lie fails the transfer, naming it, before any receive is posted.
TEST_F(kv_layer_streamer_nccl, a_frame_without_its_pair_sequence_fails_the_transfer_naming_why) {
  const nccl_kv_inbox::handle h = expect(22, prefill_peer);
  kv_sender sender({}, {});
  sender.open(22, in(10s));
  sender.ready(22, receiver_->endpoint(), "");
  frame f = frame_of(22, 0, 1, 0, num_tokens);
  f.header.in_place = true;
  f.header.payload_bytes = 0;
  ASSERT_TRUE(sender.send(f.header, {}));
  const auto done = received_.wait_for(22);
  ASSERT_TRUE(done);
  EXPECT_FALSE(done->completed);
  EXPECT_NE(done->why.find("the frame carries no pair sequence"), std::string::npos) << done->why;
  EXPECT_EQ(fabric_.num_waiting_receives(h.pair_id), 0u);
  EXPECT_EQ(receiver_->stats().num_expected, 0u);
}

// The inbox is bounded against a flood from the control path (pairs) and the KV plane (receives
// held for a gap in the sequence), refusing by name; a sequence number is taken once.
TEST_F(kv_layer_streamer_nccl, the_inbox_bounds_its_pairs_and_held_receives_and_refuses_a_repeated_sequence) {
  nccl_kv_inbox small(geometry(), links_, 1, 2);
  const nccl_kv_inbox::handle h = small.handle_for("peer a");
  try {
    small.handle_for("peer b");
    ADD_FAILURE() << "a second pair beyond the bound";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("would be pair 2, at most 1"), std::string::npos) << e.what();
  }
  auto receive = [&](uint64_t sequence) {
    nccl_kv_receive r;
    r.transfer_id = 30 + sequence;
    r.blocks = {blocks_b[0]};
    r.num_layers = 1;
    r.deadline = in(10s);
    r.done = [](const std::string&) { ADD_FAILURE() << "held receives are dropped on close, without a call"; };
    small.receive(h.pair_id, sequence, std::move(r));
  };
  receive(5);  // held: sends 0 to 4 have not been received
  receive(6);
  EXPECT_THROW(receive(5), std::runtime_error);
  try {
    receive(7);
    ADD_FAILURE() << "a third held receive beyond the bound";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("2 receives wait for send 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(small.receive("no such pair", 0, {}), std::runtime_error);
  small.close();
  EXPECT_THROW(small.handle_for("peer a"), std::runtime_error);
}

// The handle is checked before anything is posted: a pool of another shape is refused by name.
TEST_F(kv_layer_streamer_nccl, a_handle_of_another_geometry_is_refused_naming_it) {
  device_kv_pool other = geometry();
  other.element = dtype::f16;
  try {
    copier_->copy_to(encode_nccl_pool_handle("some pair", other), {blocks_a.data(), 1}, {blocks_b.data(), 1}, 0, 1,
                     in(60s));
    ADD_FAILURE() << "posted into a pool of another dtype";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("element types f32 and f16 differ"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::test
