#pragma once
// The KV data plane's tests on stories260K: a prefill on model A, frames of A's KV for a sender,
// a receiver importing into model B at other block ids, and the events both call, waited for
// with bounded waits.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "kvtransfer/kv_frame.hpp"
#include "kvtransfer/kv_receiver.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/kv_transfer_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe::test {

using namespace std::chrono_literals;

// What a receiver's or sender's events reported, and on which thread.
class event_log {
 public:
  kv_receiver_events receiver_events() {
    return {[this](uint64_t id, int64_t) { add(id, true, {}); },
            [this](uint64_t id, int64_t, const std::string& why) { add(id, false, why); }};
  }
  kv_sender_events sender_events() {
    return {[this](uint64_t id, const std::string& why) { add(id, false, why); }};
  }

  struct event {
    uint64_t transfer_id = 0;
    bool completed = false;
    std::string why;
    std::thread::id thread;
  };

  // The first event of `transfer_id`, waiting at most `timeout`; nullopt if none came.
  std::optional<event> wait_for(uint64_t transfer_id, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock lock(mutex_);
    std::optional<event> found;
    changed_.wait_for(lock, timeout, [&] {
      for (const event& e : events_) {
        if (e.transfer_id == transfer_id) {
          found = e;
          return true;
        }
      }
      return false;
    });
    return found;
  }

  size_t count(uint64_t transfer_id) const {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const event& e : events_) n += e.transfer_id == transfer_id;
    return n;
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }

 private:
  void add(uint64_t id, bool completed, std::string why) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back({id, completed, std::move(why), std::this_thread::get_id()});
    }
    changed_.notify_all();
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<event> events_;
};

// Polls `condition` every few milliseconds for at most `timeout` (for state only stats() show).
inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 20s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The ZeroMQ plane (plain_tcp off, which is the default only with CURVE keys): for the tests of
// what ZeroMQ does (message shapes, its size limit, queuing for a peer that is gone).
inline kv_channel_settings zmq_channel() {
  kv_channel_settings settings;
  settings.plain_tcp = false;
  return settings;
}

inline std::chrono::steady_clock::time_point in(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

// Two CPU instances of stories260K (pools of 16 blocks of 4): A has prefilled the prompt.
class kv_plane_test : public ::testing::Test {
 protected:
  static constexpr int64_t request_id = 42;
  const std::vector<int32_t> blocks_a = {5, 2, 9};                     // the prefill side's
  const std::vector<int32_t> blocks_b = {0, 11, 6};                    // the decode side's: other ids on purpose
  const int num_tokens = static_cast<int>(kv_transfer_prompt.size());  // 11: 3 blocks, the last partly filled

  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf");
    loaded_ = std::make_unique<loaded_model>(load_model(load_options{(stories260k_dir / "hf").string()}));
    a_ = make_cpu_model(loaded_->config, loaded_->weights, {16, 4}, 1);
    b_ = make_cpu_model(loaded_->config, loaded_->weights, {16, 4}, 1);
    next_ = prefill(*a_, kv_transfer_prompt, blocks_a);
    expected_ = decode_logits(*a_, kv_transfer_prompt, next_, blocks_a);
  }

  int num_layers() const { return loaded_->config.num_layers; }

  struct frame {
    kv_frame_header header;
    std::vector<std::byte> payload;  // [num_layers, 2, num_blocks, block_size, kv_heads, head_dim]
    std::vector<std::byte> header_bytes() const {
      std::vector<std::byte> bytes(kv_frame_header_bytes);
      encode_kv_frame_header(header, std::span<std::byte, kv_frame_header_bytes>(bytes.data(), kv_frame_header_bytes));
      return bytes;
    }
  };

  // A's KV of layers [first_layer, +count) for tokens [token_begin, token_end), as a sender sends it.
  frame frame_of(uint64_t transfer_id, int first_layer, int count, int token_begin, int token_end,
                 dtype element = dtype::f32) const {
    const int block_size = a_->kv_shape().block_size;
    const int first_block = token_begin / block_size;
    const int end_block = (token_end + block_size - 1) / block_size;
    const std::vector<int32_t> ids(blocks_a.begin() + first_block, blocks_a.begin() + end_block);
    frame f;
    f.header.transfer_id = transfer_id;
    f.header.request_id = request_id;
    f.header.token_begin = token_begin;
    f.header.token_end = token_end;
    f.header.span =
        kv_span_for(a_->config(), a_->kv_shape(), static_cast<int>(ids.size()), first_layer, count, element);
    f.payload.resize(kv_span_bytes(f.header.span));
    f.header.payload_bytes = f.payload.size();
    a_->export_kv(ids, first_layer, count, element, f.payload);
    return f;
  }

  kv_expectation expectation(uint64_t transfer_id, std::chrono::milliseconds deadline = 60s) const {
    return {transfer_id, request_id, blocks_b, num_tokens, in(deadline), false, {}};
  }

  // Queues one frame per layer of the whole prompt (as a prefill sends it) and finishes.
  void send_whole_prompt(kv_sender& sender, uint64_t transfer_id) const {
    for (int layer = 0; layer < num_layers(); ++layer) {
      frame f = frame_of(transfer_id, layer, 1, 0, num_tokens);
      ASSERT_TRUE(sender.send(f.header, std::move(f.payload))) << "layer " << layer;
    }
    sender.finish(transfer_id);
  }

  // B's whole pool, every layer of every block: a refused frame must leave it as it was.
  std::vector<std::byte> whole_pool_of_b() const {
    std::vector<int32_t> all(b_->kv_shape().num_blocks);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
    const kv_span_header header =
        kv_span_for(b_->config(), b_->kv_shape(), static_cast<int>(all.size()), 0, num_layers(), dtype::f32);
    std::vector<std::byte> pool(kv_span_bytes(header));
    b_->export_kv(all, 0, num_layers(), dtype::f32, pool);
    return pool;
  }

  std::vector<float> decode_on_b() { return decode_logits(*b_, kv_transfer_prompt, next_, blocks_b); }

  std::unique_ptr<loaded_model> loaded_;
  std::unique_ptr<model> a_, b_;
  int32_t next_ = 0;
  std::vector<float> expected_;  // [vocab] A's logits of the decode step after the prompt
};

}  // namespace troupe::test
