#pragma once
// Pair links (kvtransfer/kv_pair_link.hpp) that pair in memory the way NCCL does, for the CPU
// tests of kv_transport "nccl": both ranks must join one id (each join waits for the other, like
// ncclCommInitRank), the prefill side's sends and the decode side's receives pair in the order
// they were posted, sizes only (a mismatch is an error here; NCCL would pair the wrong bytes), and
// the bytes move between two stories260K instances' pools through export_kv / import_kv when a
// send meets its receive. A receive that gave up (deadline, stop) is withdrawn under the pair's
// lock: no send writes into its blocks afterwards. Every wait is bounded.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/kv_frame.hpp"
#include "kvtransfer/kv_pair_link.hpp"
#include "model/model.hpp"

namespace troupe::test {

class memory_pair_fabric {
 public:
  // A send's post waits (bounded) for the receive it pairs with, like a rendezvous send: a
  // sender that posts its data before the receiver had the frame (which posts the receive) is
  // then caught, its post failing with "no receive was posted".
  bool rendezvous = false;
  // Sends are taken and never delivered: a prefill peer whose data never comes.
  bool drop_sends = false;

  // The links of one process: `prefill` exports from its pool, `decode` imports into its pool.
  std::shared_ptr<kv_pair_links> links(const model& prefill, model& decode) {
    return std::make_shared<side_links>(*this, prefill, decode);
  }

  // Receives posted on pair `id` and not yet met by a send.
  size_t num_waiting_receives(const std::string& id) {
    std::shared_ptr<pair_state> p = find(id);
    if (!p) return 0;
    std::lock_guard lock(p->mutex);
    return p->receives.size();
  }
  size_t num_sends_delivered(const std::string& id) {
    std::shared_ptr<pair_state> p = find(id);
    if (!p) return 0;
    std::lock_guard lock(p->mutex);
    return p->num_delivered;
  }
  // Posts a send of `blocks` of `from` on pair `id` as a prefill rank would, without a link (the
  // peer's side after the decode side gave up). False when the pair is aborted or unknown.
  bool send_after(const std::string& id, const model& from, const std::vector<int32_t>& blocks, int layer) {
    std::shared_ptr<pair_state> p = find(id);
    if (!p) return false;
    std::lock_guard lock(p->mutex);
    if (p->aborted) return false;
    p->sends.push_back(exported(from, blocks, layer));
    match_locked(*p);
    return true;
  }

 private:
  struct message {
    int num_blocks = 0;
    int num_layers = 0;
    std::vector<std::byte> bytes;  // [num_layers, 2, num_blocks, block_size, kv_heads, head_dim] f32
  };
  struct receive {
    model* into = nullptr;
    std::vector<int32_t> blocks;
    int first_layer = 0;
    int num_layers = 0;
    uint64_t ticket = 0;
  };
  struct pair_state {
    std::mutex mutex;
    std::condition_variable changed;
    bool prefill_joined = false, decode_joined = false, aborted = false;
    std::string why;
    std::deque<message> sends;     // posted, not yet met
    std::deque<receive> receives;  // posted, not yet met
    uint64_t num_posted_receives = 0, num_met_receives = 0;
    uint64_t num_posted_sends = 0, num_delivered = 0;
  };

  static message exported(const model& from, std::span<const int32_t> blocks, int layer, int num_layers = 1) {
    message m;
    m.num_blocks = static_cast<int>(blocks.size());
    m.num_layers = num_layers;
    const kv_span_header h = kv_span_for(from.config(), from.kv_shape(), m.num_blocks, layer, num_layers, dtype::f32);
    m.bytes.resize(kv_span_bytes(h));
    from.export_kv(blocks, layer, num_layers, dtype::f32, m.bytes);
    return m;
  }

  // Pairs the oldest send with the oldest receive while both exist, in posting order.
  static void match_locked(pair_state& p) {
    while (!p.sends.empty() && !p.receives.empty()) {
      message s = std::move(p.sends.front());
      receive r = std::move(p.receives.front());
      p.sends.pop_front();
      p.receives.pop_front();
      if (s.num_blocks * s.num_layers != static_cast<int>(r.blocks.size()) * r.num_layers) {
        p.aborted = true;
        p.why = "a send of " + std::to_string(s.num_blocks * s.num_layers) + " blocks met a receive of " +
                std::to_string(r.blocks.size() * r.num_layers);
        break;
      }
      const kv_span_header h = kv_span_for(r.into->config(), r.into->kv_shape(), static_cast<int>(r.blocks.size()),
                                           r.first_layer, r.num_layers, dtype::f32);
      r.into->import_kv(r.blocks, h, s.bytes);
      ++p.num_met_receives;
      ++p.num_delivered;
    }
    p.changed.notify_all();
  }

  std::shared_ptr<pair_state> find(const std::string& id) {
    std::lock_guard lock(mutex_);
    auto it = pairs_.find(id);
    return it == pairs_.end() ? nullptr : it->second;
  }
  std::shared_ptr<pair_state> get(const std::string& id) {
    std::lock_guard lock(mutex_);
    auto& p = pairs_[id];
    if (!p) p = std::make_shared<pair_state>();
    return p;
  }

  // Waits on `p` until `done`, the deadline or `stop`; false (the pair then aborted) on the latter.
  template <class Done>
  static bool wait_locked(pair_state& p, std::unique_lock<std::mutex>& lock,
                          std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop, Done done) {
    while (!done()) {
      if (p.aborted) return false;
      if (std::chrono::steady_clock::now() >= deadline || (stop && stop())) return false;
      p.changed.wait_for(lock, std::chrono::milliseconds(2));
    }
    return true;
  }

  class link final : public kv_pair_link {
   public:
    link(memory_pair_fabric& fabric, std::shared_ptr<pair_state> p, kv_pair_side side, const model& from, model& into)
        : fabric_(fabric), p_(std::move(p)), side_(side), from_(from), into_(into) {}
    ~link() override { abort_pair("the other rank left"); }

    void post(std::span<const int32_t> blocks, int first_layer, int num_layers,
              std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) override {
      if (broken_) throw std::runtime_error("memory link: broken");
      std::unique_lock lock(p_->mutex);
      if (p_->aborted) fail(lock, "the pair was aborted: " + p_->why);
      if (side_ == kv_pair_side::decode) {
        p_->receives.push_back(
            {&into_, {blocks.begin(), blocks.end()}, first_layer, num_layers, ++p_->num_posted_receives});
        ++posted_;
        match_locked(*p_);
        return;
      }
      const uint64_t ticket = ++p_->num_posted_sends;
      ++posted_;
      if (fabric_.drop_sends) return;
      if (fabric_.rendezvous &&
          !wait_locked(*p_, lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5)), stop,
                       [&] { return p_->num_posted_receives >= ticket; })) {
        fail(lock, "no receive was posted for send " + std::to_string(ticket) + " (the frame did not go first?)");
      }
      p_->sends.push_back(exported(from_, blocks, first_layer, num_layers));
      match_locked(*p_);
    }

    void wait(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) override {
      if (broken_) throw std::runtime_error("memory link: broken");
      std::unique_lock lock(p_->mutex);
      const uint64_t target = posted_;
      const bool ok = wait_locked(*p_, lock, deadline, stop, [&] {
        return side_ == kv_pair_side::decode ? p_->num_met_receives >= target : p_->num_delivered >= target;
      });
      if (!ok)
        fail(lock, p_->aborted ? "the pair was aborted: " + p_->why : "the deadline passed or the wait was stopped");
    }

    bool broken() const override { return broken_; }

   private:
    // Like ncclCommAbort: what this rank posted and was not met is withdrawn, the pair is gone.
    [[noreturn]] void fail(std::unique_lock<std::mutex>& lock, const std::string& why) {
      lock.unlock();
      abort_pair(why);
      throw std::runtime_error("memory link: " + why);
    }
    void abort_pair(const std::string& why) {
      std::lock_guard lock(p_->mutex);
      broken_ = true;
      if (!p_->aborted) {
        p_->aborted = true;
        p_->why = why;
      }
      p_->receives.clear();
      p_->sends.clear();
      p_->changed.notify_all();
    }

    memory_pair_fabric& fabric_;
    std::shared_ptr<pair_state> p_;
    kv_pair_side side_;
    const model& from_;
    model& into_;
    uint64_t posted_ = 0;
    bool broken_ = false;
  };

  class side_links final : public kv_pair_links {
   public:
    side_links(memory_pair_fabric& fabric, const model& prefill, model& decode)
        : fabric_(fabric), prefill_(prefill), decode_(decode) {}
    std::string make_id() override {
      std::lock_guard lock(fabric_.mutex_);
      return "memory pair " + std::to_string(++fabric_.num_ids_);
    }
    std::unique_ptr<kv_pair_link> join(const std::string& id, kv_pair_side side,
                                       std::chrono::steady_clock::time_point deadline,
                                       const kv_link_stop& stop) override {
      std::shared_ptr<pair_state> p = fabric_.get(id);
      std::unique_lock lock(p->mutex);
      if (p->aborted) throw std::runtime_error("memory links: pair " + id + " was aborted");
      (side == kv_pair_side::prefill ? p->prefill_joined : p->decode_joined) = true;
      p->changed.notify_all();
      if (!wait_locked(*p, lock, deadline, stop, [&] { return p->prefill_joined && p->decode_joined; })) {
        throw std::runtime_error("memory links: the peer did not join pair " + id + " in time");
      }
      return std::make_unique<link>(fabric_, p, side, prefill_, decode_);
    }

   private:
    memory_pair_fabric& fabric_;
    const model& prefill_;
    model& decode_;
  };

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<pair_state>> pairs_;
  uint64_t num_ids_ = 0;
};

}  // namespace troupe::test
