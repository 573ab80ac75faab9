#include "kvtransfer/kv_sender.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <zmq.hpp>

#include "kvtransfer/kv_buffer_pool.hpp"
#include "kvtransfer/kv_local_receivers.hpp"
#include "kvtransfer/kv_tcp.hpp"

namespace troupe {

namespace {

// How long the thread sleeps with nothing to send before it looks at the deadlines again, and how
// long one blocking send may wait for room in a full socket before the thread looks again.
constexpr auto idle_wait = std::chrono::milliseconds(20);
constexpr int send_timeout_ms = 20;
// Deadlines are looked at this often while frames flow (not for every frame: the scan is over
// every open transfer).
constexpr auto expiry_interval = std::chrono::milliseconds(5);
// Messages ZeroMQ may hold per destination beyond what the thread hands it: a few frames in
// flight keep the link busy; more would be memory outside max_buffered_bytes.
constexpr int send_high_water_mark = 8;
// Early ready()s kept for transfers not open yet (a decode instance answered before the prefill
// side opened): enough for every request in flight, bounded against a flood.
constexpr size_t max_early_ready = 4096;
// How long connecting to a plain-TCP receiver may take before the transfer fails.
constexpr auto tcp_connect_timeout = std::chrono::milliseconds(1000);
// Payload buffers kept for reuse, at most (their bytes are bounded by max_pooled_bytes): a
// step's frames (one per layer of each streaming request) come back one by one while the
// exporter takes the next ones; a few dozen would only lengthen take_buffer's scan.
constexpr size_t max_pooled_buffers = 16;

std::string transfer_name(uint64_t transfer_id) { return "KV transfer " + std::to_string(transfer_id); }

struct destination {
  std::string endpoint;
  std::string server_public_key;  // "" without CURVE
  std::string key() const { return endpoint + "|" + server_public_key; }
};

struct queued_frame {
  std::array<std::byte, kv_frame_header_bytes> header;
  std::vector<std::byte> payload;  // from the pool (take_buffer) or the caller; goes back to the pool
};

// A payload ZeroMQ took over without a copy: its free function (on ZeroMQ's I/O thread, once the
// bytes are sent or the message dropped) gives the buffer back. The pool is shared so that it
// outlives a message ZeroMQ frees late.
struct lent_payload {
  std::vector<std::byte> buffer;
  std::shared_ptr<kv_buffer_pool> pool;
};

struct failure {
  uint64_t transfer_id = 0;
  std::string why;
};

enum class hand_result { handed, socket_full, refused };

}  // namespace

class kv_sender::impl {
 public:
  impl(kv_channel_settings settings, kv_sender_events events)
      : settings_(std::move(settings)),
        events_(std::move(events)),
        pool_(std::make_shared<kv_buffer_pool>(max_pooled_buffers,
                                               std::min(settings_.max_pooled_bytes, settings_.max_buffered_bytes))) {
    thread_ = std::thread([this] { run(); });
  }

  ~impl() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    sockets_.clear();  // each waits at most settings_.linger for what it still holds
    for (const auto& [key, fd] : tcp_sockets_) ::close(fd);
  }

  void open(uint64_t transfer_id, std::chrono::steady_clock::time_point deadline) {
    {
      std::lock_guard lock(mutex_);
      auto [it, inserted] = transfers_.try_emplace(transfer_id);
      if (!inserted) throw std::invalid_argument(transfer_name(transfer_id) + " is already open");
      it->second.deadline = deadline;
      it->second.window =
          std::max(std::chrono::steady_clock::duration::zero(), deadline - std::chrono::steady_clock::now());
      if (auto early = early_ready_.find(transfer_id); early != early_ready_.end()) {
        it->second.to = std::move(early->second);
        early_ready_.erase(early);
      }
    }
    wake_.notify_all();
  }

  std::vector<std::byte> take_buffer(size_t bytes) { return pool_->take(bytes); }

  bool send(kv_frame_header header, std::vector<std::byte> payload) {
    if (header.payload_bytes != payload.size()) {
      throw std::invalid_argument(transfer_name(header.transfer_id) + ": header payload_bytes " +
                                  std::to_string(header.payload_bytes) + " but the payload has " +
                                  std::to_string(payload.size()));
    }
    queued_frame frame;
    encode_kv_frame_header(header, frame.header);
    const size_t size = payload.size();
    frame.payload = std::move(payload);
    {
      std::lock_guard lock(mutex_);
      auto it = transfers_.find(header.transfer_id);
      if (it == transfers_.end()) {
        pool_->give_back(std::move(frame.payload));
        return false;
      }
      if (num_buffered_bytes_ + size > settings_.max_buffered_bytes) {
        pool_->give_back(std::move(frame.payload));
        fail_locked(it, "the sender's buffer of " + std::to_string(settings_.max_buffered_bytes) + " bytes is full (" +
                            std::to_string(num_buffered_bytes_) + " queued, a frame of " + std::to_string(size) +
                            " more)");
        wake_.notify_all();
        return false;
      }
      num_buffered_bytes_ += size;
      it->second.frames.push_back(std::move(frame));
      // What the pool keeps counts against the queue's limit: queued and kept bytes together never
      // pass max_buffered_bytes, so recycling never holds more than the queue alone could.
      pool_->trim_to(settings_.max_buffered_bytes - num_buffered_bytes_);
    }
    wake_.notify_all();
    return true;
  }

  void ready(uint64_t transfer_id, std::string endpoint, std::string server_public_key) {
    {
      std::lock_guard lock(mutex_);
      destination to{std::move(endpoint), std::move(server_public_key)};
      auto it = transfers_.find(transfer_id);
      if (it != transfers_.end()) {
        if (!it->second.to) {
          it->second.to = std::move(to);
          // The decode side reserved its blocks just now and counts its own deadline from there:
          // the frames get the whole window from this moment too, however long the reservation took.
          it->second.deadline = std::max(it->second.deadline, std::chrono::steady_clock::now() + it->second.window);
        }
      } else if (early_ready_.try_emplace(transfer_id, std::move(to)).second) {
        early_order_.push_back(transfer_id);
        while (early_order_.size() > max_early_ready) {
          early_ready_.erase(early_order_.front());
          early_order_.pop_front();
        }
      }
    }
    wake_.notify_all();
  }

  void finish(uint64_t transfer_id) {
    std::lock_guard lock(mutex_);
    auto it = transfers_.find(transfer_id);
    if (it == transfers_.end()) return;
    it->second.finished = true;
    close_if_done_locked(it);
  }

  void cancel(uint64_t transfer_id) {
    {
      std::lock_guard lock(mutex_);
      auto it = transfers_.find(transfer_id);
      if (it != transfers_.end()) erase_locked(it);
      early_ready_.erase(transfer_id);
    }
    idle_.notify_all();
  }

  void give_up(uint64_t transfer_id, int64_t request_id, const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      auto it = transfers_.find(transfer_id);
      if (it == transfers_.end()) return;
      for (queued_frame& f : it->second.frames) {
        num_buffered_bytes_ -= f.payload.size();
        pool_->give_back(std::move(f.payload));
      }
      it->second.frames.clear();
      queued_frame frame;
      frame.payload = encode_kv_give_up_reason(why);
      encode_kv_frame_header(kv_give_up_header(transfer_id, request_id, frame.payload.size()), frame.header);
      num_buffered_bytes_ += frame.payload.size();
      it->second.frames.push_back(std::move(frame));
      it->second.finished = true;
    }
    wake_.notify_all();
  }

  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return idle_.wait_for(lock, timeout, [&] { return num_buffered_bytes_ == 0 && !in_flight_; });
  }

  kv_sender_stats stats() const {
    std::lock_guard lock(mutex_);
    const kv_buffer_pool_stats pool = pool_->stats();
    return {num_frames_,     num_bytes_,         transfers_.size(), num_buffered_bytes_, num_destinations_,
            pool.num_reused, pool.num_allocated, pool.num_kept,     pool.num_kept_bytes};
  }

 private:
  struct transfer {
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::duration window{};  // open()'s deadline less the time it was opened
    std::deque<queued_frame> frames;               // FIFO: sent in the order queued
    std::optional<destination> to;
    bool finished = false;   // its last frame is queued
    bool in_flight = false;  // the thread is handing one of its frames over now
  };
  using transfer_iterator = std::map<uint64_t, transfer>::iterator;

  void erase_locked(transfer_iterator it) {
    for (queued_frame& f : it->second.frames) {
      num_buffered_bytes_ -= f.payload.size();
      pool_->give_back(std::move(f.payload));
    }
    transfers_.erase(it);
  }

  void fail_locked(transfer_iterator it, const std::string& why) {
    failures_.push_back({it->first, transfer_name(it->first) + " failed: " + why});
    erase_locked(it);
  }

  void close_if_done_locked(transfer_iterator it) {
    if (it->second.finished && it->second.frames.empty() && !it->second.in_flight) transfers_.erase(it);
  }

  // The next transfer with a frame to send, after `last_sent_` in id order (a long transfer does
  // not hold up the others).
  transfer_iterator next_sendable_locked() {
    auto sendable = [](const transfer& t) { return t.to && !t.frames.empty() && !t.in_flight; };
    for (auto it = transfers_.upper_bound(last_sent_); it != transfers_.end(); ++it) {
      if (sendable(it->second)) return it;
    }
    for (auto it = transfers_.begin(); it != transfers_.end() && it->first <= last_sent_; ++it) {
      if (sendable(it->second)) return it;
    }
    return transfers_.end();
  }

  void expire_locked(std::chrono::steady_clock::time_point now) {
    for (auto it = transfers_.begin(); it != transfers_.end();) {
      auto next = std::next(it);
      if (it->second.deadline <= now) {
        const transfer& t = it->second;
        // Its socket was full and stayed so: the peer takes nothing (it died, or never came).
        // Closing the socket frees the frames ZeroMQ holds for it; a later transfer reconnects.
        if (t.to && blocked_.contains(t.to->key())) close_socket(t.to->key());
        fail_locked(it, "its deadline passed " +
                            (t.to ? "with " + std::to_string(t.frames.size()) + " frames unsent to " + t.to->endpoint
                                  : std::string("before the destination was known (no ready)")) +
                            (t.finished ? "" : ", its last frame not queued"));
      }
      it = next;
    }
  }

  void run() {
    std::unique_lock lock(mutex_);
    auto next_expiry = std::chrono::steady_clock::now();
    while (!stop_) {
      if (const auto now = std::chrono::steady_clock::now(); now >= next_expiry) {
        expire_locked(now);
        next_expiry = now + expiry_interval;
      }
      if (!failures_.empty()) {
        std::vector<failure> failed = std::exchange(failures_, {});
        lock.unlock();
        idle_.notify_all();
        for (const failure& f : failed) {
          spdlog::warn("kv sender: {}", f.why);
          if (events_.failed) events_.failed(f.transfer_id, f.why);
        }
        lock.lock();
        continue;
      }
      auto it = next_sendable_locked();
      if (it == transfers_.end()) {
        idle_.notify_all();
        pool_->release_if_idle(std::chrono::steady_clock::now(), settings_.pooled_idle_release);
        wake_.wait_for(lock, idle_wait);
        continue;
      }
      const uint64_t id = it->first;
      transfer& t = it->second;
      queued_frame frame = std::move(t.frames.front());
      t.frames.pop_front();
      t.in_flight = in_flight_ = true;
      const size_t size = frame.payload.size();
      num_buffered_bytes_ -= size;
      const destination to = *t.to;
      const auto deadline = t.deadline;
      last_sent_ = id;
      lock.unlock();

      std::string why;
      const hand_result result = hand_over(frame, to, deadline, why);
      // Its bytes have left (or never will): the buffer is free for the exporter's next frame.
      // ZeroMQ took its payload over (moved out, empty here) and gives it back when it frees it.
      if (result != hand_result::socket_full) pool_->give_back(std::move(frame.payload));

      lock.lock();
      in_flight_ = false;
      auto now_it = transfers_.find(id);  // cancel or a deadline may have closed it meanwhile
      if (result == hand_result::handed) {
        ++num_frames_;
        num_bytes_ += size;
      }
      if (now_it == transfers_.end()) {
        pool_->give_back(std::move(frame.payload));  // a socket_full frame of a transfer gone meanwhile
        continue;
      }
      now_it->second.in_flight = false;
      if (result == hand_result::socket_full) {
        num_buffered_bytes_ += size;
        now_it->second.frames.push_front(std::move(frame));
      } else if (result == hand_result::refused) {
        fail_locked(now_it, why);
      } else {
        close_if_done_locked(now_it);
      }
    }
  }

  // Hands one frame to a receiver of this process or to the destination's socket, on the thread.
  hand_result hand_over(queued_frame& frame, const destination& to, std::chrono::steady_clock::time_point deadline,
                        std::string& why) {
    if (settings_.allow_direct && deliver_to_local_receiver(to.endpoint, frame.header, frame.payload)) {
      return hand_result::handed;
    }
    if (is_kv_tcp_endpoint(to.endpoint)) return hand_over_tcp(frame, to, deadline, why);
    try {
      zmq::socket_t* socket = socket_for(to, why);
      if (!socket) return hand_result::refused;
      // The receiver takes both parts or neither: once the header is in, the payload follows.
      if (!socket->send(zmq::buffer(frame.header), zmq::send_flags::sndmore)) {
        blocked_.insert(to.key());
        return hand_result::socket_full;
      }
      blocked_.erase(to.key());
      zmq::message_t body;  // an in-place frame's payload is empty: nothing to lend
      if (!frame.payload.empty()) {
        auto* lent = new lent_payload{std::move(frame.payload), pool_};
        body = zmq::message_t(
            lent->buffer.data(), lent->buffer.size(),
            [](void*, void* owner) {
              std::unique_ptr<lent_payload> back(static_cast<lent_payload*>(owner));
              back->pool->give_back(std::move(back->buffer));
            },
            lent);
      }
      if (!socket->send(body, zmq::send_flags::none)) {
        why = "the payload was not taken after its header on " + to.endpoint;
        return hand_result::refused;
      }
      return hand_result::handed;
    } catch (const zmq::error_t& e) {
      why = "sending to " + to.endpoint + ": " + e.what();
      return hand_result::refused;
    }
  }

  // Plain TCP: the frame goes out from its own buffer, written by this thread. A frame the
  // socket had no room for is queued again untouched; one cut off half-way breaks the stream, so
  // the connection is closed (the receiver drops the partial frame) and the transfer fails.
  hand_result hand_over_tcp(queued_frame& frame, const destination& to, std::chrono::steady_clock::time_point deadline,
                            std::string& why) {
    const std::string key = to.key();
    auto it = tcp_sockets_.find(key);
    if (it != tcp_sockets_.end() && kv_tcp_peer_closed(it->second)) {
      // The receiver closed it (it restarted, or refused a frame it could not frame): reconnect.
      std::lock_guard lock(mutex_);
      close_socket(key);
      it = tcp_sockets_.end();
    }
    if (it == tcp_sockets_.end()) {
      const int fd = kv_tcp_connect(to.endpoint, tcp_connect_timeout, std::chrono::milliseconds(send_timeout_ms), why);
      if (fd < 0) return hand_result::refused;
      it = tcp_sockets_.emplace(key, fd).first;
      std::lock_guard lock(mutex_);
      num_destinations_ = sockets_.size() + tcp_sockets_.size();
    }
    switch (kv_tcp_write_frame(it->second, frame.header, frame.payload, deadline, why)) {
      case kv_tcp_write::done: blocked_.erase(key); return hand_result::handed;
      case kv_tcp_write::no_room: blocked_.insert(key); return hand_result::socket_full;
      default:
        why = "sending to " + to.endpoint + ": " + why;
        {
          std::lock_guard lock(mutex_);  // close_socket updates num_destinations_ (expire calls it locked)
          close_socket(key);
        }
        return hand_result::refused;
    }
  }

  void close_socket(const std::string& key) {
    if (auto tcp = tcp_sockets_.find(key); tcp != tcp_sockets_.end()) {
      ::close(tcp->second);
      tcp_sockets_.erase(tcp);
      num_destinations_ = sockets_.size() + tcp_sockets_.size();
    }
    blocked_.erase(key);
    auto it = sockets_.find(key);
    if (it == sockets_.end()) return;
    it->second.set(zmq::sockopt::linger, 0);
    sockets_.erase(it);
    num_destinations_ = sockets_.size() + tcp_sockets_.size();
  }

  // One PUSH socket per destination, connected on first use and kept.
  zmq::socket_t* socket_for(const destination& to, std::string& why) {
    const std::string key = to.key();
    if (auto it = sockets_.find(key); it != sockets_.end()) return &it->second;
    if (!to.server_public_key.empty() && settings_.keys.empty()) {
      why = "the receiver at " + to.endpoint + " wants CURVE, this sender has no keys";
      return nullptr;
    }
    zmq::socket_t socket(context_, zmq::socket_type::push);
    socket.set(zmq::sockopt::linger, static_cast<int>(settings_.linger.count()));
    socket.set(zmq::sockopt::sndtimeo, send_timeout_ms);
    socket.set(zmq::sockopt::sndhwm, send_high_water_mark);
    if (!to.server_public_key.empty()) {
      socket.set(zmq::sockopt::curve_serverkey, to.server_public_key);
      socket.set(zmq::sockopt::curve_publickey, settings_.keys.public_key);
      socket.set(zmq::sockopt::curve_secretkey, settings_.keys.secret_key);
    }
    socket.connect(to.endpoint);
    zmq::socket_t* kept = &sockets_.emplace(key, std::move(socket)).first->second;
    std::lock_guard lock(mutex_);
    num_destinations_ = sockets_.size() + tcp_sockets_.size();
    return kept;
  }

  const kv_channel_settings settings_;
  const kv_sender_events events_;
  const std::shared_ptr<kv_buffer_pool> pool_;  // shared with the payloads ZeroMQ holds

  zmq::context_t context_{1};
  std::map<std::string, zmq::socket_t> sockets_;  // the thread's only (destination key -> socket)
  std::set<std::string> blocked_;                 // the thread's only: sockets full at their last send
  std::map<std::string, int> tcp_sockets_;        // the thread's only: plain TCP connections by destination

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // something to send, or stop
  std::condition_variable idle_;  // a frame left the queues
  std::map<uint64_t, transfer> transfers_;
  std::map<uint64_t, destination> early_ready_;
  std::deque<uint64_t> early_order_;  // early_ready_'s ids, oldest first
  std::vector<failure> failures_;     // to report on the thread
  size_t num_buffered_bytes_ = 0;
  uint64_t num_frames_ = 0;
  uint64_t num_bytes_ = 0;
  uint64_t last_sent_ = 0;
  size_t num_destinations_ = 0;  // sockets_.size(), for stats() on other threads
  bool in_flight_ = false;
  bool stop_ = false;
  std::thread thread_;
};

kv_sender::kv_sender(kv_channel_settings settings, kv_sender_events events)
    : impl_(std::make_unique<impl>(std::move(settings), std::move(events))) {}
kv_sender::~kv_sender() = default;
void kv_sender::open(uint64_t transfer_id, std::chrono::steady_clock::time_point deadline) {
  impl_->open(transfer_id, deadline);
}
std::vector<std::byte> kv_sender::take_buffer(size_t bytes) { return impl_->take_buffer(bytes); }
bool kv_sender::send(kv_frame_header header, std::vector<std::byte> payload) {
  return impl_->send(header, std::move(payload));
}
void kv_sender::ready(uint64_t transfer_id, std::string endpoint, std::string server_public_key) {
  impl_->ready(transfer_id, std::move(endpoint), std::move(server_public_key));
}
void kv_sender::finish(uint64_t transfer_id) { impl_->finish(transfer_id); }
void kv_sender::cancel(uint64_t transfer_id) { impl_->cancel(transfer_id); }
void kv_sender::give_up(uint64_t transfer_id, int64_t request_id, const std::string& why) {
  impl_->give_up(transfer_id, request_id, why);
}
bool kv_sender::wait_idle(std::chrono::milliseconds timeout) { return impl_->wait_idle(timeout); }
kv_sender_stats kv_sender::stats() const { return impl_->stats(); }

}  // namespace troupe
