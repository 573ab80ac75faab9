// The sender's recycled payload buffers (kv_sender::take_buffer): a frame's buffer comes back
// once its bytes have left — over plain TCP, over ZeroMQ (when ZeroMQ frees the message), by a
// direct delivery — or when its frame is dropped (cancel, deadline, refusal), and the next frame
// takes it; what is kept stays bounded; and no buffer is handed out again while a socket still
// reads it: transfers from several threads at once, through a small pool, arrive intact.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

kv_channel_settings through_the_socket(bool plain_tcp) {
  kv_channel_settings settings;
  settings.plain_tcp = plain_tcp;
  settings.allow_direct = false;
  return settings;
}

class kv_sender_buffers_test : public kv_plane_test {
 protected:
  // One frame per layer of the prompt, each payload taken from the sender's pool.
  void send_from_pool(kv_sender& sender, uint64_t transfer_id) const {
    for (int layer = 0; layer < num_layers(); ++layer) {
      frame f = frame_of(transfer_id, layer, 1, 0, num_tokens);
      std::vector<std::byte> payload = sender.take_buffer(f.payload.size());
      std::memcpy(payload.data(), f.payload.data(), f.payload.size());
      ASSERT_TRUE(sender.send(f.header, std::move(payload))) << "layer " << layer;
    }
    sender.finish(transfer_id);
  }

  // Two transfers, one after the other, with pooled payloads: the second takes back every buffer
  // the first used, once they are all returned, and both arrive bitwise equal.
  void second_transfer_reuses_the_first_ones_buffers(const kv_channel_settings& settings) {
    event_log received;
    kv_receiver receiver(*b_, settings, received.receiver_events());
    kv_sender sender(settings, {});
    const size_t n = static_cast<size_t>(num_layers());
    for (uint64_t id : {7u, 8u}) {
      receiver.expect(expectation(id));
      sender.open(id, in(60s));
      send_from_pool(sender, id);
      sender.ready(id, receiver.endpoint(), receiver.public_key());
      const auto done = received.wait_for(id);
      ASSERT_TRUE(done) << receiver.stats().last_refusal;
      ASSERT_TRUE(done->completed) << done->why;
      EXPECT_EQ(decode_on_b(), expected_);
      // Over ZeroMQ the last buffers come back when its I/O thread frees the messages.
      ASSERT_TRUE(eventually([&] { return sender.stats().num_pooled_buffers == n; }))
          << sender.stats().num_pooled_buffers << " of " << n << " buffers back";
    }
    const kv_sender_stats stats = sender.stats();
    EXPECT_EQ(stats.num_buffers_allocated, n);  // the first transfer's
    EXPECT_EQ(stats.num_buffers_reused, n);     // the second's, every one
  }
};

TEST_F(kv_sender_buffers_test, buffers_sent_over_plain_tcp_are_reused) {
  second_transfer_reuses_the_first_ones_buffers(through_the_socket(true));
}

TEST_F(kv_sender_buffers_test, buffers_zeromq_freed_are_reused) {
  second_transfer_reuses_the_first_ones_buffers(through_the_socket(false));
}

TEST_F(kv_sender_buffers_test, buffers_delivered_directly_are_reused) {
  kv_channel_settings settings;
  settings.allow_direct = true;
  second_transfer_reuses_the_first_ones_buffers(settings);
}

TEST_F(kv_sender_buffers_test, cancel_a_deadline_and_a_refusal_give_the_buffers_back) {
  event_log sent;
  kv_sender sender({}, sent.sender_events());
  const size_t frame_bytes = frame_of(7, 0, 1, 0, num_tokens).payload.size();
  auto queue_three = [&](uint64_t id) {
    for (int layer = 0; layer < 3; ++layer) {
      frame f = frame_of(id, layer, 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, sender.take_buffer(frame_bytes)));
    }
  };
  sender.open(7, in(60s));
  queue_three(7);  // no ready: held
  EXPECT_EQ(sender.stats().num_pooled_buffers, 0u);
  sender.cancel(7);
  EXPECT_EQ(sender.stats().num_pooled_buffers, 3u);

  sender.open(8, in(300ms));
  queue_three(8);  // taken back from the pool
  EXPECT_EQ(sender.stats().num_buffers_reused, 3u);
  EXPECT_EQ(sender.stats().num_pooled_buffers, 0u);
  ASSERT_TRUE(sent.wait_for(8));  // its deadline
  EXPECT_EQ(sender.stats().num_pooled_buffers, 3u);

  frame late = frame_of(8, 0, 1, 0, num_tokens);
  EXPECT_FALSE(sender.send(late.header, sender.take_buffer(frame_bytes)));  // closed: refused
  EXPECT_EQ(sender.stats().num_pooled_buffers, 3u);
  EXPECT_EQ(sender.stats().num_buffers_allocated, 3u);
  EXPECT_EQ(sender.stats().num_pooled_bytes, 3 * frame_bytes);
}

TEST_F(kv_sender_buffers_test, what_the_pool_keeps_is_bounded) {
  const size_t frame_bytes = frame_of(7, 0, 1, 0, num_tokens).payload.size();
  {
    kv_sender sender({}, {});
    sender.open(7, in(60s));
    for (int i = 0; i < 40; ++i) {
      frame f = frame_of(7, i % num_layers(), 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, sender.take_buffer(frame_bytes)));
    }
    sender.cancel(7);
    EXPECT_EQ(sender.stats().num_pooled_buffers, 16u);  // the count bound
  }
  {
    kv_channel_settings settings;
    settings.max_pooled_bytes = frame_bytes * 5 / 2;  // two frames' buffers
    kv_sender sender(settings, {});
    sender.open(7, in(60s));
    for (int i = 0; i < 6; ++i) {
      frame f = frame_of(7, i % num_layers(), 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, sender.take_buffer(frame_bytes)));
    }
    sender.cancel(7);
    EXPECT_EQ(sender.stats().num_pooled_buffers, 2u);
    EXPECT_LE(sender.stats().num_pooled_bytes, settings.max_pooled_bytes);
  }
  {
    // Queued and kept together stay within max_buffered_bytes: queuing shrinks what is kept.
    kv_channel_settings settings;
    settings.max_buffered_bytes = frame_bytes * 4;
    kv_sender sender(settings, {});
    sender.open(7, in(60s));
    for (int i = 0; i < 4; ++i) {
      frame f = frame_of(7, i, 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));  // buffers not from the pool come back too
    }
    sender.cancel(7);
    EXPECT_EQ(sender.stats().num_pooled_buffers, 4u);
    sender.open(8, in(60s));
    for (int i = 0; i < 3; ++i) {
      frame f = frame_of(8, i, 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, std::move(f.payload)));
      const kv_sender_stats stats = sender.stats();
      EXPECT_LE(stats.num_buffered_bytes + stats.num_pooled_bytes, settings.max_buffered_bytes) << "frame " << i;
    }
    EXPECT_EQ(sender.stats().num_pooled_buffers, 1u);
  }
}

TEST_F(kv_sender_buffers_test, an_idle_sender_frees_the_buffers_it_kept) {
  kv_channel_settings settings;
  settings.pooled_idle_release = 100ms;
  kv_sender sender(settings, {});
  const size_t frame_bytes = frame_of(7, 0, 1, 0, num_tokens).payload.size();
  sender.open(7, in(60s));
  frame f = frame_of(7, 0, 1, 0, num_tokens);
  ASSERT_TRUE(sender.send(f.header, sender.take_buffer(frame_bytes)));
  sender.cancel(7);
  EXPECT_EQ(sender.stats().num_pooled_buffers, 1u);
  EXPECT_TRUE(eventually([&] { return sender.stats().num_pooled_buffers == 0; }, 5s));
  EXPECT_EQ(sender.stats().num_pooled_bytes, 0u);
}

// ---- intact bytes under heavy reuse ----------------------------------------------------------

// A decode side that keeps nothing but checks every imported word: frame payloads are filled with
// a word naming their transfer (its first block) and layer, so a buffer refilled for another
// frame while a socket still read it arrives with another frame's word.
class checking_model final : public model {
 public:
  static constexpr int block_size = 16;
  checking_model(int num_layers, int num_blocks) : num_blocks_(num_blocks) {
    config_.arch = architecture::llama;
    config_.hidden_size = 512;
    config_.intermediate_size = 1024;
    config_.num_layers = num_layers;
    config_.num_heads = 8;
    config_.num_kv_heads = 8;
    config_.head_dim = 64;  // a block of one layer: 2 x 16 x 8 x 64 x 4 bytes = 64 KiB
    config_.vocab_size = 256;
    config_.max_position_embeddings = 4096;
  }
  static uint32_t word(int32_t first_block, int layer) { return uint32_t(first_block) << 8 | uint32_t(layer); }

  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return {num_blocks_, block_size}; }
  std::string backend_name() const override { return "checking"; }
  void forward(const forward_batch&, float*) override { throw std::logic_error("checking model: no forward"); }
  dtype kv_dtype() const override { return dtype::f32; }
  void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                 std::span<const std::byte> data) override {
    const uint32_t expected = word(block_ids.front(), header.first_layer);
    size_t wrong = 0;
    for (size_t at = 0; at + sizeof expected <= data.size(); at += sizeof expected) {
      uint32_t got;
      std::memcpy(&got, data.data() + at, sizeof got);
      wrong += got != expected;
    }
    num_wrong_words_ += wrong;
    num_frames_ += 1;
  }
  uint64_t num_wrong_words() const { return num_wrong_words_; }
  uint64_t num_frames() const { return num_frames_; }

 private:
  model_config config_;
  int num_blocks_;
  std::atomic<uint64_t> num_wrong_words_{0}, num_frames_{0};
};

// Four threads stream transfers at once through one sender whose pool keeps four frames'
// buffers: each frame's buffer is one a frame before it used, refilled the moment it is back.
void transfers_arrive_intact_under_heavy_reuse(kv_channel_settings settings) {
  constexpr int num_layers = 6, num_threads = 4, transfers_per_thread = 6, blocks_per_transfer = 16;  // 1 MiB frames
  constexpr int num_transfers = num_threads * transfers_per_thread;
  checking_model decode_side(num_layers, num_transfers * blocks_per_transfer);
  const kv_span_header layer_span =
      kv_span_for(decode_side.config(), decode_side.kv_shape(), blocks_per_transfer, 0, 1, dtype::f32);
  const size_t frame_bytes = kv_span_bytes(layer_span);
  settings.max_pooled_bytes = 4 * frame_bytes;
  event_log received;
  kv_receiver receiver(decode_side, settings, received.receiver_events());
  kv_sender sender(settings, {});

  auto stream = [&](int thread) {
    for (int i = 0; i < transfers_per_thread; ++i) {
      const int index = thread * transfers_per_thread + i;
      const uint64_t id = uint64_t(index) + 1;
      std::vector<int32_t> blocks(blocks_per_transfer);
      for (int b = 0; b < blocks_per_transfer; ++b) blocks[b] = index * blocks_per_transfer + b;
      receiver.expect({id, index, blocks, blocks_per_transfer * checking_model::block_size, in(60s)});
      sender.open(id, in(60s));
      sender.ready(id, receiver.endpoint(), receiver.public_key());
      for (int layer = 0; layer < num_layers; ++layer) {
        kv_frame_header h;
        h.transfer_id = id;
        h.request_id = index;
        h.token_end = blocks_per_transfer * checking_model::block_size;
        h.span = layer_span;
        h.span.first_layer = layer;
        h.payload_bytes = frame_bytes;
        std::vector<std::byte> payload = sender.take_buffer(frame_bytes);
        const uint32_t word = checking_model::word(blocks.front(), layer);
        for (size_t at = 0; at + sizeof word <= payload.size(); at += sizeof word) {
          std::memcpy(payload.data() + at, &word, sizeof word);
        }
        if (!sender.send(h, std::move(payload))) return;
      }
      sender.finish(id);
      // One transfer at a time per thread, as a prefill streams a request's layers as they are
      // computed: the next one's buffers are those other threads' frames just gave back.
      if (!received.wait_for(id, 30s)) return;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(stream, t);
  for (std::thread& t : threads) t.join();

  for (uint64_t id = 1; id <= uint64_t(num_transfers); ++id) {
    const auto done = received.wait_for(id, 30s);
    ASSERT_TRUE(done) << "transfer " << id << ": " << receiver.stats().last_refusal;
    EXPECT_TRUE(done->completed) << done->why;
  }
  EXPECT_EQ(decode_side.num_frames(), uint64_t(num_transfers * num_layers));
  EXPECT_EQ(decode_side.num_wrong_words(), 0u);
  const kv_sender_stats stats = sender.stats();
  EXPECT_EQ(stats.num_buffers_reused + stats.num_buffers_allocated, uint64_t(num_transfers * num_layers));
  EXPECT_GT(stats.num_buffers_reused, 0u) << "no buffer was reused: the test checked nothing";
  EXPECT_LE(stats.num_pooled_bytes, settings.max_pooled_bytes);
}

TEST(kv_sender_buffers, transfers_over_plain_tcp_arrive_intact_under_heavy_reuse) {
  transfers_arrive_intact_under_heavy_reuse(through_the_socket(true));
}

TEST(kv_sender_buffers, transfers_over_zeromq_arrive_intact_under_heavy_reuse) {
  transfers_arrive_intact_under_heavy_reuse(through_the_socket(false));
}

}  // namespace
}  // namespace troupe::test
