#include "kvtransfer/kv_receiver.hpp"

#include <spdlog/spdlog.h>
#include <zmq.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <zmq.hpp>

#include "kvtransfer/curve_zap.hpp"
#include "kvtransfer/kv_local_receivers.hpp"
#include "kvtransfer/kv_tcp.hpp"
#include "net/bounded_accept.hpp"
#include "net/connection_guard.hpp"
#include "net/peer_address.hpp"
#include "net/private_directory.hpp"
#include "net/relay_listener.hpp"

namespace troupe {

namespace {

// How long the thread waits on its sockets before it looks at the deadlines again.
constexpr int poll_timeout_ms = 20;
// Frames taken per wake before the deadlines are looked at: a flood cannot starve expiry.
constexpr int max_frames_per_wake = 64;

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// An event to call once the receiver's lock is released (an event may call expect or cancel);
// a failed nccl transfer's pair is ended then too.
using outcome = kv_lease_outcome;

}  // namespace

class kv_receiver::impl final : public kv_frame_sink {
 public:
  impl(model& m, kv_channel_settings settings, kv_receiver_events events, std::shared_ptr<nccl_kv_inbox> inbox)
      : model_(m),
        settings_(std::move(settings)),
        events_(std::move(events)),
        config_(m.config()),
        pool_(m.kv_shape()),
        inbox_(std::move(inbox)),
        leases_(config_, pool_, inbox_ != nullptr) {
    if (!settings_.keys.empty()) {
      // The ZAP handler must be bound before the CURVE socket: without one, ZeroMQ lets every
      // client with any key in.
      zap_.emplace(context_, zmq::socket_type::rep);
      zap_->set(zmq::sockopt::linger, 0);
      zap_->bind(zap_endpoint);
      allowed_keys_.insert(settings_.keys.allowed_public_keys.begin(), settings_.keys.allowed_public_keys.end());
      pull_.set(zmq::sockopt::curve_server, 1);
      pull_.set(zmq::sockopt::curve_secretkey, settings_.keys.secret_key);
      pull_.set(zmq::sockopt::zap_domain, "troupe-kv");
      const std::string monitor_endpoint = "inproc://troupe-kv-monitor";
      if (zmq_socket_monitor(pull_.handle(), monitor_endpoint.c_str(),
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
        throw std::runtime_error(std::string("kv receiver: cannot monitor its socket: ") + zmq_strerror(zmq_errno()));
      }
      monitor_.emplace(context_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(monitor_endpoint);
    }
    pull_.set(zmq::sockopt::linger, 0);
    if (settings_.plain_tcp && settings_.keys.empty()) {
      listener_ = kv_tcp_listen(settings_.bind_host, endpoint_);
      reserve_spare_descriptor();
      guard_.emplace(connection_limits{max_pending, max_connections, first_frame_timeout}, "KV port " + endpoint_);
      register_local_receiver(endpoint_, *this);
      thread_ = std::thread([this] { run(); });
      return;
    }
    // A peer announcing a bigger message is disconnected before ZeroMQ allocates it.
    pull_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kv_frame_header_bytes + settings_.max_payload_bytes));
    // libzmq accepts every connection offered until the process has no descriptor left, so the
    // port senders reach is a relay_listener with the plain-TCP port's bounds, moving bytes
    // unchanged to the PULL socket's Unix socket in a 0700 directory: CURVE stays end to end.
    relay_directory_.emplace("troupe-kv");
    const std::string bind_endpoint = "ipc://" + relay_directory_->path() + "/kv.sock";
    try {
      pull_.bind(bind_endpoint);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error("kv receiver: cannot bind " + bind_endpoint + ": " + e.what());
    }
    relay_listener_options relay;
    relay.host = settings_.bind_host;
    relay.target_path = relay_directory_->path() + "/kv.sock";
    relay.limits = connection_limits{max_pending, max_connections, first_frame_timeout};
    relay.where = "KV port";
    relay_.emplace(std::move(relay));
    try {
      relay_->start();
    } catch (const std::exception& e) {
      throw std::runtime_error("kv receiver: cannot listen on " + settings_.bind_host + ": " + e.what());
    }
    endpoint_ = "tcp://" + relay_->bound_address();
    register_local_receiver(endpoint_, *this);
    thread_ = std::thread([this] { run(); });
  }

  ~impl() override {
    unregister_local_receiver(endpoint_);  // no sender of this process is inside take_frame after this
    stop_ = true;
    if (relay_) relay_->stop();  // no sender reaches the PULL socket while it closes
    thread_.join();              // no connection is accepted after this
    // A read inside a frame returns at once: a peer dripping a frame must not hold the shutdown.
    if (guard_) guard_->shut_all();
    for (const auto& r : readers_) r->thread.join();  // each closes its connection
    if (inbox_) inbox_->close();                      // joins the pairs' threads: no receive calls back after this
    for (const tcp_connection& c : silent_) ::close(c.fd);
    if (listener_ >= 0) ::close(listener_);
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& public_key() const { return settings_.keys.public_key; }

  void expect(kv_expectation e) {
    std::lock_guard lock(mutex_);
    leases_.expect(std::move(e));
  }

  void cancel(uint64_t transfer_id) {
    std::optional<std::string> device_pair;
    {
      std::lock_guard lock(mutex_);
      device_pair = leases_.cancel(transfer_id);
    }
    // Outside the lock: a receive that completes meanwhile books under it (and finds nothing).
    if (device_pair && !device_pair->empty()) {
      inbox_->end(*device_pair, "transfer " + std::to_string(transfer_id) + " was cancelled");
    }
  }

  void fail(uint64_t transfer_id, const std::string& why) {
    std::optional<outcome> result;
    {
      std::lock_guard lock(mutex_);
      result = leases_.fail(transfer_id, why).failed;
    }
    if (result) fire(*result);
  }

  kv_receiver_stats stats() const {
    std::lock_guard lock(mutex_);
    kv_receiver_stats s = stats_;
    s.num_expected = leases_.size();
    return s;
  }

  // The one path of every frame, from the socket or a sender of this process. The import runs
  // under the lock on purpose: cancel() must not return while a frame is still being written into
  // blocks the caller is about to give back to its scheduler.
  void take_frame(std::span<const std::byte> header_bytes, std::span<const std::byte> payload) override {
    std::optional<outcome> result;
    {
      std::lock_guard lock(mutex_);
      result = take_frame_locked(header_bytes, payload);
    }
    if (result) fire(*result);
  }

 private:
  // A sender's plain-TCP connection (settings.plain_tcp without keys).
  struct tcp_connection {
    int fd = -1;
    std::vector<std::byte> buffer;  // [the largest payload so far], reused frame after frame
    uint64_t ticket = 0;            // its entry in guard_
  };
  std::optional<outcome> take_frame_locked(std::span<const std::byte> header_bytes,
                                           std::span<const std::byte> payload) {
    kv_frame_header h;
    try {
      h = decode_kv_frame_header(header_bytes, settings_.max_payload_bytes);
    } catch (const std::invalid_argument& e) {
      refuse_locked(e.what());  // nothing in it can be trusted, not even which transfer it names
      return std::nullopt;
    }
    kv_frame_verdict verdict = leases_.admit(h, payload.size());
    if (!verdict.lease) {
      refuse_locked(std::move(verdict.refusal));
      return std::move(verdict.failed);
    }
    kv_lease& lease = *verdict.lease;
    if (h.gave_up) {
      // The sender cannot send the rest: the transfer fails now, with its reason.
      std::string reason(reinterpret_cast<const char*>(payload.data()), payload.size());
      for (char& c : reason) {
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
      }
      return leases_.fail(h.transfer_id, "its sender gave it up: " + reason).failed;
    }
    std::string why;
    if (!lease.expectation.device_pair.empty()) {
      why = queue_device_receive(lease, h, payload);
      if (why.empty()) return std::nullopt;  // booked when the receive completes
    }
    if (why.empty() && !h.in_place) {
      try {
        model_.import_kv(leases_.blocks_of(lease, h), h.span, payload);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      kv_frame_verdict failed = leases_.fail(h.transfer_id, why);
      refuse_locked(std::move(failed.refusal));
      return std::move(failed.failed);
    }
    ++stats_.num_frames;
    stats_.num_bytes += payload.size();
    return leases_.book(h);
  }

  // An in-place frame of an nccl transfer: its layer's blocks are received on the transfer's
  // pair (in frame order), and the frame is booked by the receive's completion. Why not ("" when
  // queued).
  std::string queue_device_receive(kv_lease& lease, const kv_frame_header& h, std::span<const std::byte> payload) {
    // decode_kv_frame_header checked that num_blocks is what the token range spans, exactly
    // (NCCL pairs sizes), and the lease table that the range lies inside the lease's blocks.
    const std::span<const int32_t> blocks = leases_.blocks_of(lease, h);
    nccl_kv_receive r;
    r.transfer_id = h.transfer_id;
    r.blocks.assign(blocks.begin(), blocks.end());
    r.first_layer = h.span.first_layer;
    r.num_layers = h.span.num_layers;
    r.deadline = lease.expectation.deadline;
    r.done = [this, h](const std::string& why) { device_receive_done(h, why); };
    try {
      inbox_->receive(lease.expectation.device_pair, decode_kv_frame_sequence(payload), std::move(r));
    } catch (const std::exception& e) {
      return e.what();
    }
    leases_.accept(lease, h);
    return {};
  }

  // On the pair's thread: the receive of frame `h` completed ("") or failed.
  void device_receive_done(const kv_frame_header& h, const std::string& why) {
    std::optional<outcome> result;
    {
      std::lock_guard lock(mutex_);
      // A lease cancelled, failed or expired meanwhile finds nothing: its pair was ended then.
      if (why.empty()) {
        if (leases_.find(h.transfer_id)) ++stats_.num_frames;
        result = leases_.book(h);
      } else {
        result = leases_.fail(h.transfer_id, why).failed;  // not a refused frame: the frame was fine
      }
    }
    if (result) fire(*result);
  }

  void refuse_locked(std::string why) {
    ++stats_.num_refused;
    spdlog::debug("kv receiver {}: refused a frame: {}", endpoint_, why);
    stats_.last_refusal = std::move(why);
  }

  void fire(const outcome& o) {
    // Sends of the transfer may still come on its pair, which would pair them with the next
    // transfer's receives: the pair is broken (and a receive in flight stopped) first.
    if (!o.completed && !o.device_pair.empty()) inbox_->end(o.device_pair, o.why);
    if (o.completed) {
      if (events_.complete) events_.complete(o.transfer_id, o.request_id);
    } else {
      spdlog::warn("kv receiver {}: {}", endpoint_, o.why);
      if (events_.failed) events_.failed(o.transfer_id, o.request_id, o.why);
    }
  }

  void run() {
    if (listener_ >= 0) return run_plain_tcp();
    std::vector<zmq::pollitem_t> items = {{pull_.handle(), 0, ZMQ_POLLIN, 0}};
    if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
    if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
    while (!stop_) {
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(poll_timeout_ms));
        if (items[0].revents & ZMQ_POLLIN) receive_frames();
        if (zap_ && (items[1].revents & ZMQ_POLLIN)) answer_zap();
        if (monitor_ && (items[2].revents & ZMQ_POLLIN)) read_monitor();
      } catch (const zmq::error_t& e) {
        spdlog::error("kv receiver {}: {}", endpoint_, e.what());
      }
      expire(std::chrono::steady_clock::now());
    }
  }

  // ---- plain TCP (settings.plain_tcp, no keys) ----
  //
  // This thread accepts connections and watches the silent ones (accepted, no byte yet); a
  // connection that has something to read gets a reader thread of its own for the rest of its
  // life, which reads its frames blocking (the kernel wakes it per frame, not per packet). A peer
  // dripping a frame holds only its own reader until its read deadline: every other sender's
  // frames are read meanwhile (issue 25; one thread read every frame before). Reader threads are
  // at most max_connections, the connections the guard lets be open at once.

  void run_plain_tcp() {
    std::vector<zmq::pollitem_t> items;
    while (!stop_) {
      reap_readers();
      // At the readers' cap, the silent connections are not watched: one that became readable
      // would wake the poll at once, forever, until a reader is free (they are still expired).
      const bool room = readers_.size() < max_connections;
      items.assign(1, {nullptr, listener_, ZMQ_POLLIN, 0});
      if (room) {
        for (const tcp_connection& c : silent_) items.push_back({nullptr, c.fd, ZMQ_POLLIN, 0});
      }
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(poll_timeout_ms));
      } catch (const zmq::error_t& e) {
        spdlog::error("kv receiver {}: {}", endpoint_, e.what());
      }
      // Silent connections first (their indexes match items 1..), then new ones.
      for (size_t i = items.size() - 1; i > 0; --i) {
        const short revents = items[i].revents;
        if (!(revents & (ZMQ_POLLIN | ZMQ_POLLERR))) continue;
        tcp_connection c = std::move(silent_[i - 1]);
        silent_.erase(silent_.begin() + static_cast<std::ptrdiff_t>(i - 1));
        // Shut down by the guard (timed out or evicted) or reset: nothing to read, no reader.
        if ((revents & ZMQ_POLLERR) || hung_up(c.fd)) {
          close_connection(c);
        } else if (readers_.size() < max_connections) {
          start_reader(std::move(c));
        } else {
          silent_.push_back(std::move(c));  // read when a reader is free
        }
      }
      if (items[0].revents & ZMQ_POLLIN) accept_connections();
      guard_->expire();  // connections that sent no frame in time: shut, then closed above
      expire(std::chrono::steady_clock::now());
    }
  }

  // Both directions shut (the guard's shutdown(2)) or the connection reset.
  static bool hung_up(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0;
  }

  void close_connection(const tcp_connection& c) {
    guard_->closed(c.ticket);  // before close(2): the guard never shuts a reused descriptor
    ::close(c.fd);
  }

  // Through the net layer: at the open-files limit a waiting connection is shed rather than left
  // to wake the poll at once, forever (100 % CPU, issue 25); at most max_connections are open
  // and each must send its first frame header within first_frame_timeout; refusals are logged
  // at a bounded rate.
  void accept_connections() {
    for (int i = 0; i < 1024; ++i) {
      std::string shed;
      const int fd = accept_connection(listener_, shed);
      if (!shed.empty()) guard_->log().refuse("out of file descriptors", shed);
      if (fd < 0) return;
      uint64_t evicted = 0;
      const uint64_t ticket = guard_->admit(fd, peer_address(fd), &evicted);
      if (evicted != 0) close_silent(evicted);  // a flood accepted in a batch holds no shut descriptors
      if (ticket == 0) {
        ::close(fd);
        continue;
      }
      kv_tcp_prepare_accepted(fd, stall_timeout);
      silent_.push_back({fd, {}, ticket});
    }
  }

  // Closes the silent connection with `ticket` now, if it is one (a reader's sees the shutdown).
  void close_silent(uint64_t ticket) {
    auto it = std::find_if(silent_.begin(), silent_.end(), [&](const tcp_connection& c) { return c.ticket == ticket; });
    if (it == silent_.end()) return;
    close_connection(*it);
    silent_.erase(it);
  }

  void start_reader(tcp_connection c) {
    auto reader = std::make_unique<tcp_reader>();
    tcp_reader& r = *reader;
    r.thread = std::thread([this, &r, c = std::move(c)]() mutable {
      read_connection(c);
      close_connection(c);
      r.done = true;
    });
    readers_.push_back(std::move(reader));
  }

  // Joins the readers whose connection has closed.
  void reap_readers() {
    for (auto it = readers_.begin(); it != readers_.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      (*it)->thread.join();
      it = readers_.erase(it);
    }
  }

  // A reader thread: the connection's frames, one after another, until it closes, fails, or the
  // receiver stops. Between frames it waits for the next one's first byte in short ticks, so a
  // stopping receiver is seen (the guard's shut_all also ends a read in flight).
  void read_connection(tcp_connection& c) {
    while (!stop_) {
      pollfd p{c.fd, POLLIN, 0};
      const int rc = ::poll(&p, 1, poll_timeout_ms * 5);
      if (rc < 0 && errno != EINTR) return;
      if (rc <= 0) continue;
      if (!serve_connection(c)) return;
    }
  }

  // One frame from a connection: the header is checked against its transfer before a byte of
  // the payload is read or a buffer is sized for it. False: close the connection (the peer left,
  // stalled, or sent something that leaves the stream without trustworthy framing).
  bool serve_connection(tcp_connection& c) {
    std::array<std::byte, kv_frame_header_bytes> header;
    std::string why;
    // Every read has a deadline, not only a stall bound: a byte every half second never stalls.
    if (!kv_tcp_read_exact(c.fd, header, read_deadline(header.size()), why)) {
      if (why != "the peer closed the connection") spdlog::debug("kv receiver {}: {}", endpoint_, why);
      return false;
    }
    kv_frame_header h;
    try {
      h = decode_kv_frame_header(header, settings_.max_payload_bytes);
    } catch (const std::invalid_argument& e) {
      std::lock_guard lock(mutex_);
      refuse_locked(e.what());
      return false;  // its payload_bytes cannot be trusted to find the next frame
    }
    guard_->established(c.ticket);
    std::optional<outcome> failed;
    bool wanted = false;
    {
      std::lock_guard lock(mutex_);
      wanted = precheck_locked(h, failed);
    }
    if (failed) fire(*failed);
    if (!wanted) return discard(c, h.payload_bytes);
    c.buffer.resize(h.payload_bytes);  // the connection's buffer: grown once, then reused
    if (!kv_tcp_read_exact(c.fd, c.buffer, read_deadline(c.buffer.size()), why)) {
      spdlog::debug("kv receiver {}: {}", endpoint_, why);
      return false;
    }
    take_frame(header, c.buffer);  // every check again, then the import
    return true;
  }

  // Reads and drops a refused frame's payload (its size passed the header's checks), in pieces,
  // so that the stream stays framed without a buffer of the announced size.
  bool discard(tcp_connection& c, uint64_t num_bytes) {
    constexpr uint64_t piece = uint64_t(1) << 20;
    std::string why;
    while (num_bytes > 0) {
      const uint64_t n = std::min(num_bytes, piece);
      if (c.buffer.size() < n) c.buffer.resize(n);
      if (!kv_tcp_read_exact(c.fd, std::span(c.buffer.data(), n), read_deadline(n), why)) return false;
      num_bytes -= n;
    }
    return true;
  }

  // take_frame's checks that need only the header: false (counted, and the transfer failed where
  // it is expected, as take_frame would) when the frame would be refused.
  bool precheck_locked(const kv_frame_header& h, std::optional<outcome>& failed) {
    kv_frame_verdict verdict = leases_.admit(h, h.payload_bytes);
    if (verdict.lease) return true;
    refuse_locked(std::move(verdict.refusal));
    failed = std::move(verdict.failed);
    return false;
  }

  void receive_frames() {
    for (int i = 0; i < max_frames_per_wake; ++i) {
      zmq::message_t header;
      if (!pull_.recv(header, zmq::recv_flags::dontwait)) return;
      if (!header.more()) {
        refuse_part_count(1);
        continue;
      }
      zmq::message_t payload;
      (void)pull_.recv(payload, zmq::recv_flags::none);  // the parts of one message arrive together
      if (payload.more()) {
        int num_parts = 2;
        zmq::message_t rest;
        do {
          (void)pull_.recv(rest, zmq::recv_flags::none);
          ++num_parts;
        } while (rest.more());
        refuse_part_count(num_parts);
        continue;
      }
      take_frame(bytes_of(header), bytes_of(payload));
    }
  }

  void refuse_part_count(int num_parts) {
    std::lock_guard lock(mutex_);
    refuse_locked("a message of " + std::to_string(num_parts) + " parts, expected 2 (header, payload)");
  }

  // ZAP (RFC 27): ZeroMQ asks here whether a client that passed the CURVE handshake may connect.
  void answer_zap() {
    const std::string refused = answer_zap_request(*zap_, allowed_keys_);
    if (refused.empty()) return;
    std::lock_guard lock(mutex_);
    // Logged by read_monitor, which sees this refusal as a failed handshake next.
    stats_.last_refusal = refused + " is not among the allowed keys";
  }

  // Handshake failures: a peer without CURVE (protocol), with a bad key (no detail), or refused
  // by the ZAP handler above (auth). Each is one refused connection.
  void read_monitor() {
    zmq::message_t event, address;
    if (!monitor_->recv(event, zmq::recv_flags::dontwait)) return;
    if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::none);
    uint16_t id = 0;
    if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
    std::lock_guard lock(mutex_);
    const uint64_t n = ++stats_.num_refused_peers;
    if (id != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      // The ZAP handler named the key for an auth failure; here the peer never got that far.
      stats_.last_refusal = "a peer failed the CURVE handshake on " + endpoint_ + " (no or wrong keys)";
    }
    // A refused peer reconnects every 100 ms: the 1st, 2nd, 4th, 8th ... refusal is logged.
    if ((n & (n - 1)) == 0)
      spdlog::warn("kv receiver {}: refused connection {}: {}", endpoint_, n, stats_.last_refusal);
  }

  void expire(std::chrono::steady_clock::time_point now) {
    std::vector<outcome> expired;
    {
      std::lock_guard lock(mutex_);
      expired = leases_.expire(now);
    }
    for (const outcome& o : expired) fire(o);
  }

  model& model_;
  const kv_channel_settings settings_;
  const kv_receiver_events events_;
  const model_config config_;
  const kv_cache_shape pool_;
  const std::shared_ptr<nccl_kv_inbox> inbox_;
  std::set<std::string> allowed_keys_;

  // With keys: the PULL socket's private directory (declared first: removed after the socket
  // closes) and the relay senders connect to (stopped first, in the destructor).
  std::optional<private_directory> relay_directory_;
  std::optional<relay_listener> relay_;
  zmq::context_t context_{1};
  std::optional<zmq::socket_t> zap_;  // declared before pull_: bound first, closed last
  zmq::socket_t pull_{context_, zmq::socket_type::pull};
  std::optional<zmq::socket_t> monitor_;
  std::string endpoint_;

  mutable std::mutex mutex_;
  kv_lease_table leases_;  // under mutex_
  kv_receiver_stats stats_;

  // When `num_bytes` read from now must have arrived: the stall bound and 1 MB/s for the bytes.
  static std::chrono::steady_clock::time_point read_deadline(size_t num_bytes) {
    return std::chrono::steady_clock::now() + stall_timeout + std::chrono::microseconds(num_bytes);
  }

  // Plain TCP: the listener and the senders' connections, the receiver thread's only.
  static constexpr size_t max_connections = 64;
  // Fewer than max_connections: a flood of silent connections fills the pending slots only, so a
  // sender connecting meanwhile evicts the oldest of them instead of being refused until they
  // time out (with the two equal, a flood kept the senders out for first_frame_timeout).
  static constexpr size_t max_pending = 16;
  static constexpr std::chrono::milliseconds stall_timeout{1000};        // inside a frame
  static constexpr std::chrono::milliseconds first_frame_timeout{5000};  // a connection's first header
  int listener_ = -1;
  std::vector<tcp_connection> silent_;  // accepted, nothing to read yet: the thread's only
  struct tcp_reader {
    std::thread thread;
    std::atomic<bool> done{false};  // its connection is closed: join it
  };
  std::vector<std::unique_ptr<tcp_reader>> readers_;  // the thread's only (the destructor's after it)
  std::optional<connection_guard> guard_;             // the listener's bounds; shut_all ends reads in flight

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

kv_receiver::kv_receiver(model& m, kv_channel_settings settings, kv_receiver_events events,
                         std::shared_ptr<nccl_kv_inbox> inbox)
    : impl_(std::make_unique<impl>(m, std::move(settings), std::move(events), std::move(inbox))) {}
kv_receiver::~kv_receiver() = default;
const std::string& kv_receiver::endpoint() const { return impl_->endpoint(); }
const std::string& kv_receiver::public_key() const { return impl_->public_key(); }
void kv_receiver::expect(kv_expectation expectation) { impl_->expect(std::move(expectation)); }
void kv_receiver::cancel(uint64_t transfer_id) { impl_->cancel(transfer_id); }
void kv_receiver::fail(uint64_t transfer_id, const std::string& why) { impl_->fail(transfer_id, why); }
kv_receiver_stats kv_receiver::stats() const { return impl_->stats(); }

}  // namespace troupe
