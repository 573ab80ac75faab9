#include "kvtransfer/nccl_kv_inbox.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <stdexcept>

#include "kvtransfer/nccl_pool_handle.hpp"

namespace troupe {

namespace {

// How long end() waits past the in-flight receive's own deadline before it gives up waiting
// (the link polls the stop flag every few microseconds; this bound is for a link that does not).
constexpr auto end_grace = std::chrono::seconds(1);

}  // namespace

struct nccl_kv_inbox::pair {
  std::string id;
  std::string peer;
  std::deque<nccl_kv_receive> queue;         // in sequence, for the thread
  std::map<uint64_t, nccl_kv_receive> held;  // arrived before one they follow
  uint64_t next_sequence = 0;                // the next to queue
  bool broken = false;
  std::string why;                // why it broke
  std::atomic<bool> stop{false};  // polled by the link's waits
  bool busy = false;              // a receive is posted or being waited for
  std::chrono::steady_clock::time_point busy_until;
  bool finished = false;  // its thread has left its loop
  std::condition_variable wake;
  std::thread thread;
};

nccl_kv_inbox::nccl_kv_inbox(device_kv_pool pool, std::shared_ptr<kv_pair_links> links, size_t max_pairs,
                             size_t max_held)
    : pool_(pool), links_(std::move(links)), max_pairs_(max_pairs), max_held_(max_held) {
  if (!links_) throw std::invalid_argument("nccl kv inbox: no links to join pairs with");
}

nccl_kv_inbox::~nccl_kv_inbox() { close(); }

nccl_kv_inbox::handle nccl_kv_inbox::handle_for(const std::string& peer) {
  if (peer.empty()) {
    throw std::invalid_argument(
        "nccl kv inbox: the transfer names no prefill peer (kv_handoff.peer); nccl needs one "
        "communicator per prefill instance");
  }
  std::vector<std::thread> finished;
  handle h;
  {
    std::lock_guard lock(mutex_);
    if (closed_) throw std::runtime_error("nccl kv inbox: closed");
    reap_locked(finished);
    if (auto it = live_id_of_peer_.find(peer); it != live_id_of_peer_.end()) {
      h = {encode_nccl_pool_handle(it->second, pool_), it->second};
    } else {
      if (live_id_of_peer_.size() >= max_pairs_) {
        throw std::invalid_argument("nccl kv inbox: prefill peer " + peer + " would be pair " +
                                    std::to_string(max_pairs_ + 1) + ", at most " + std::to_string(max_pairs_));
      }
      auto p = std::make_shared<pair>();
      p->id = links_->make_id();
      p->peer = peer;
      if (pairs_.contains(p->id)) throw std::runtime_error("nccl kv inbox: a pair id came twice");
      h = {encode_nccl_pool_handle(p->id, pool_), p->id};
      p->thread = std::thread([this, p] { run(p); });
      pairs_.emplace(p->id, p);
      live_id_of_peer_.emplace(peer, p->id);
    }
  }
  for (std::thread& t : finished) t.join();
  return h;
}

void nccl_kv_inbox::receive(const std::string& pair_id, uint64_t sequence, nccl_kv_receive r) {
  std::lock_guard lock(mutex_);
  auto it = pairs_.find(pair_id);
  if (it == pairs_.end()) throw std::runtime_error("nccl kv inbox: the transfer's pair is unknown here (closed?)");
  pair& p = *it->second;
  const std::string named = "nccl kv inbox: the pair with prefill peer " + p.peer;
  if (p.broken) throw std::runtime_error(named + " is broken: " + p.why);
  if (sequence < p.next_sequence || p.held.contains(sequence)) {
    throw std::runtime_error(named + ": send " + std::to_string(sequence) + " was received already");
  }
  if (sequence != p.next_sequence && p.held.size() >= max_held_) {
    throw std::runtime_error(named + ": " + std::to_string(max_held_) + " receives wait for send " +
                             std::to_string(p.next_sequence));
  }
  p.held.emplace(sequence, std::move(r));
  // Queued strictly in the sender's posting order: NCCL pairs by order alone.
  for (auto next = p.held.find(p.next_sequence); next != p.held.end(); next = p.held.find(p.next_sequence)) {
    p.queue.push_back(std::move(next->second));
    p.held.erase(next);
    ++p.next_sequence;
  }
  p.wake.notify_one();
}

void nccl_kv_inbox::end(const std::string& pair_id, const std::string& why) {
  std::unique_lock lock(mutex_);
  auto it = pairs_.find(pair_id);
  if (it == pairs_.end()) return;
  std::shared_ptr<pair> p = it->second;
  if (p->thread.get_id() == std::this_thread::get_id()) {
    break_locked(*p, why);  // from a done callback: nothing of this pair is in flight
    return;
  }
  break_locked(*p, why);
  const auto until = p->busy_until + end_grace;
  if (!idle_.wait_until(lock, until, [&] { return !p->busy; })) {
    spdlog::error("nccl kv inbox: a receive from prefill peer {} did not stop by its deadline", p->peer);
  }
}

void nccl_kv_inbox::close() {
  std::vector<std::shared_ptr<pair>> all;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (auto& [id, p] : pairs_) {
      p->queue.clear();  // no callbacks: the owner is going away
      p->held.clear();
      break_locked(*p, "the inbox closed");
      all.push_back(p);
    }
    pairs_.clear();
    live_id_of_peer_.clear();
  }
  for (auto& p : all) {
    if (p->thread.joinable()) p->thread.join();
  }
}

size_t nccl_kv_inbox::num_pairs() const {
  std::lock_guard lock(mutex_);
  return live_id_of_peer_.size();
}

void nccl_kv_inbox::break_locked(pair& p, const std::string& why) {
  if (!p.broken) {
    p.broken = true;
    p.why = why;
    spdlog::info("nccl kv inbox: the pair with prefill peer {} is dropped ({}); its next transfer makes a new one",
                 p.peer, why);
  }
  p.stop = true;
  if (auto it = live_id_of_peer_.find(p.peer); it != live_id_of_peer_.end() && it->second == p.id) {
    live_id_of_peer_.erase(it);
  }
  p.wake.notify_all();
}

void nccl_kv_inbox::reap_locked(std::vector<std::thread>& finished) {
  for (auto it = pairs_.begin(); it != pairs_.end();) {
    if (!it->second->finished) {
      ++it;
      continue;
    }
    finished.push_back(std::move(it->second->thread));
    it = pairs_.erase(it);
  }
}

void nccl_kv_inbox::run(const std::shared_ptr<pair>& p) {
  std::unique_ptr<kv_pair_link> link;
  const kv_link_stop stop = [p] { return p->stop.load(); };
  for (;;) {
    nccl_kv_receive r;
    std::deque<nccl_kv_receive> failed;
    std::string why;
    bool leaving = false;
    {
      std::unique_lock lock(mutex_);
      p->wake.wait(lock, [&] { return !p->queue.empty() || p->broken; });
      if (p->broken) {
        failed.swap(p->queue);
        for (auto& [sequence, held] : p->held) failed.push_back(std::move(held));
        p->held.clear();
        why = p->why;
        leaving = true;
        p->finished = true;
      } else {
        r = std::move(p->queue.front());
        p->queue.pop_front();
        p->busy = true;
        p->busy_until = r.deadline;
      }
    }
    if (leaving) {
      link.reset();  // aborts the channel (nothing of it is in flight: the loop waits for each receive)
      for (nccl_kv_receive& f : failed) {
        if (f.done) f.done("the pair with prefill peer " + p->peer + " broke: " + why);
      }
      return;
    }
    std::string error;
    try {
      if (!link) link = links_->join(p->id, kv_pair_side::decode, r.deadline, stop);
      link->post(r.blocks, r.first_layer, r.num_layers, r.deadline, stop);
      link->wait(r.deadline, stop);
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lock(mutex_);
      p->busy = false;
      if (!error.empty()) break_locked(*p, "a receive failed: " + error);
    }
    idle_.notify_all();
    if (r.done) r.done(error.empty() ? std::string() : "nccl receive from prefill peer " + p->peer + ": " + error);
  }
}

}  // namespace troupe
