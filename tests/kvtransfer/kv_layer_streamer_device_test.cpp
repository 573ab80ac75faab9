// The prefill side's device path (kv_transport "cuda_ipc") checked on the CPU: kv_layer_streamer with
// a copier of this test's own, which moves a layer's blocks from one stories260K instance's pool
// into another's the way the CUDA IPC copier does device to device. Each layer the forward
// writes goes into the decode side's reserved block ids (from the destination its kv_ready
// named), an in-place frame per layer through a real sender completes the receiver's in-place
// lease, and the decode step on the receiving model gives the prefill side's logits. The CUDA
// copier itself is checked on a GPU (tests/backends/cuda/gpu_kv_transports_test.cpp).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/kv_layer_streamer.hpp"
#include "tests/kvtransfer/kv_stream_steps.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

constexpr const char* pool_of_b = "the decode side's pool";

// Copies by export/import between two host pools, and notes what it was asked.
class host_copier final : public device_kv_copier {
 public:
  host_copier(const model& from, model& to) : from_(from), to_(to) {}

  struct call {
    std::vector<int32_t> local, peer;
    int layer = 0;
  };

  void copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
               std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
               std::chrono::steady_clock::time_point) override {
    if (peer_handle != pool_of_b) throw std::invalid_argument("unknown peer handle");
    calls.push_back(
        {{local_blocks.begin(), local_blocks.end()}, {peer_blocks.begin(), peer_blocks.end()}, first_layer});
    move_kv(from_, calls.back().local, to_, calls.back().peer, first_layer, num_layers, dtype::f32);
  }

  std::vector<call> calls;

 private:
  const model& from_;
  model& to_;
};

class kv_layer_streamer_device : public kv_plane_test {
 protected:
  void SetUp() override {
    kv_plane_test::SetUp();
    if (IsSkipped()) return;
    copier_ = std::make_shared<host_copier>(*a_, *b_);
    destinations_ = std::make_shared<kv_device_destinations>();
  }

  void stream(kv_layer_streamer& out, const std::vector<int>& cuts) {
    stream_prompt(out, request_id, kv_transfer_prompt, blocks_a, cuts, num_layers());
  }

  std::shared_ptr<host_copier> copier_;
  std::shared_ptr<kv_device_destinations> destinations_;
};

TEST_F(kv_layer_streamer_device, a_chunked_prefill_copies_each_layer_into_the_reserved_blocks_and_completes_in_place) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  kv_expectation e = expectation(7);
  e.in_place = true;
  receiver.expect(e);
  kv_sender sender({}, {});
  kv_layer_streamer out(*a_, sender, 60s, kv_device_path{copier_, destinations_});
  out.start(request_id, 7);
  // The decode side's answer (through the router and the prefill worker's KV agent).
  destinations_->put(7, kv_device_destination{pool_of_b, blocks_b}, in(60s));
  sender.ready(7, receiver.endpoint(), "");

  stream(out, {0, 6, num_tokens});

  const auto done = received.wait_for(7);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(receiver.stats().num_bytes, 0u) << "the frames must be in place";
  EXPECT_EQ(receiver.stats().num_frames, uint64_t(2 * num_layers()));
  // Chunk one: blocks 0-1 (tokens [0, 6)); chunk two from the block it left partly filled.
  ASSERT_EQ(copier_->calls.size(), size_t(2 * num_layers()));
  for (int layer = 0; layer < num_layers(); ++layer) {
    const auto& first = copier_->calls[layer];
    const auto& second = copier_->calls[num_layers() + layer];
    EXPECT_EQ(first.layer, layer);
    EXPECT_EQ(first.local, (std::vector<int32_t>{blocks_a[0], blocks_a[1]}));
    EXPECT_EQ(first.peer, (std::vector<int32_t>{blocks_b[0], blocks_b[1]}));
    EXPECT_EQ(second.local, (std::vector<int32_t>{blocks_a[1], blocks_a[2]}));
    EXPECT_EQ(second.peer, (std::vector<int32_t>{blocks_b[1], blocks_b[2]}));
  }
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(destinations_->num_held(), 0u);
  out.forget(request_id, false);
  EXPECT_EQ(out.num_streams(), 0u);
}

// The destination comes from another thread (the KV agent) after the step is planned: the step
// waits for it rather than compute KV it could not place.
TEST_F(kv_layer_streamer_device, a_destination_that_arrives_after_the_step_began_is_waited_for) {
  event_log received;
  kv_receiver receiver(*b_, {}, received.receiver_events());
  kv_expectation e = expectation(8);
  e.in_place = true;
  receiver.expect(e);
  kv_sender sender({}, {});
  kv_layer_streamer out(*a_, sender, 60s, kv_device_path{copier_, destinations_});
  out.start(request_id, 8);
  std::thread agent([&] {
    std::this_thread::sleep_for(50ms);
    destinations_->put(8, kv_device_destination{pool_of_b, blocks_b}, in(60s));
    sender.ready(8, receiver.endpoint(), "");
  });
  stream(out, {0, num_tokens});
  agent.join();
  const auto done = received.wait_for(8);
  ASSERT_TRUE(done) << receiver.stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
}

// No destination by the transfer's deadline, or one with fewer blocks than the prompt needs:
// nothing is copied or sent for it (the receiver's own deadline then fails the transfer and the
// request runs again), and the other work of the step goes on.
TEST_F(kv_layer_streamer_device, no_destination_by_the_deadline_or_too_few_blocks_copies_and_sends_nothing) {
  kv_sender sender({}, {});
  {
    kv_layer_streamer out(*a_, sender, 100ms, kv_device_path{copier_, destinations_});
    out.start(request_id, 9);
    EXPECT_FALSE(out.prepare(prefill_step(request_id, kv_transfer_prompt, blocks_a, 0, num_tokens, true), {&blocks_a}));
    out.forget(request_id, false);
  }
  {
    kv_layer_streamer out(*a_, sender, 60s, kv_device_path{copier_, destinations_});
    out.start(request_id, 10);
    destinations_->put(10, kv_device_destination{pool_of_b, {blocks_b[0]}}, in(60s));
    ASSERT_TRUE(out.prepare(prefill_step(request_id, kv_transfer_prompt, blocks_a, 0, num_tokens, true), {&blocks_a}));
    for (int layer = 0; layer < num_layers(); ++layer) out.on_layer_written(layer);
    out.finish_step();
    out.forget(request_id, false);
  }
  EXPECT_TRUE(copier_->calls.empty());
  EXPECT_EQ(sender.stats().num_frames, 0u);
  EXPECT_EQ(destinations_->num_held(), 0u);
}

}  // namespace
}  // namespace troupe::test
