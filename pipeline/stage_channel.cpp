#include "pipeline/stage_channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "kvtransfer/curve_zap.hpp"
#include "kvtransfer/kv_tcp.hpp"

namespace troupe {

namespace {

int milliseconds_until(stage_channel::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

class tcp_channel final : public stage_channel {
 public:
  explicit tcp_channel(int fd) : fd_(fd) {}
  ~tcp_channel() override { ::close(fd_); }

  std::string write(std::span<const std::byte> head, std::span<const std::byte> tail, time_point deadline) override {
    std::string why;
    const kv_tcp_write written = kv_tcp_write_frame(fd_, head, tail, deadline, why);
    if (written == kv_tcp_write::done) return "";
    return why.empty() ? "the peer took no frame in time" : why;
  }
  bool readable(std::chrono::milliseconds wait) override {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(wait.count())) > 0;
  }
  std::string read_header(std::span<std::byte, stage_frame_header_bytes> header, time_point deadline) override {
    return read(header, deadline);
  }
  std::string read(std::span<std::byte> out, time_point deadline) override {
    std::string why;
    return kv_tcp_read_exact(fd_, out, deadline, why) ? "" : why;
  }
  std::string peer_gone() override {
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return "";
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return "the stage closed the connection";
    // Readable between frames: either the close (0 bytes) or bytes nobody asked for.
    char byte = 0;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return "the stage closed the connection";
    if (n > 0) return "the stage sent bytes while no step was asked of it";
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return "";
    return std::string("the connection failed: ") + std::strerror(errno);
  }

 private:
  int fd_;
};

// ZeroMQ PAIR with CURVE. The server end also answers ZAP requests on its own context, whenever
// it waits on its socket.
class curve_channel final : public stage_channel {
 public:
  curve_channel(bool server, const kv_channel_keys& keys, uint64_t max_frame_bytes)
      : socket_(context_, zmq::socket_type::pair) {
    if (keys.empty()) throw std::runtime_error("pipeline stage link: curve:// needs the cluster's CURVE keys");
    if (server) {
      zap_.emplace(context_, zmq::socket_type::rep);  // bound before the CURVE socket (curve_zap.hpp)
      zap_->set(zmq::sockopt::linger, 0);
      zap_->bind(zap_endpoint);
      allowed_.insert(keys.allowed_public_keys.begin(), keys.allowed_public_keys.end());
      socket_.set(zmq::sockopt::curve_server, 1);
      socket_.set(zmq::sockopt::curve_secretkey, keys.secret_key);
      socket_.set(zmq::sockopt::zap_domain, "troupe-pipeline");
    } else {
      socket_.set(zmq::sockopt::curve_publickey, keys.public_key);
      socket_.set(zmq::sockopt::curve_secretkey, keys.secret_key);
      // PAIR reconnects by itself and says nothing of a lost peer: its disconnects are watched.
      const std::string events = "inproc://troupe-stage-link-" + std::to_string(reinterpret_cast<uintptr_t>(this));
      if (zmq_socket_monitor(socket_.handle(), events.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
        throw std::runtime_error(std::string("pipeline stage link: cannot watch the connection: ") +
                                 zmq_strerror(zmq_errno()));
      }
      monitor_.emplace(context_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(events);
    }
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_frame_bytes));
    // A peer that vanishes without closing (a cut network) is noticed within seconds.
    socket_.set(zmq::sockopt::heartbeat_ivl, 1000);
    socket_.set(zmq::sockopt::heartbeat_timeout, 5000);
  }

  zmq::socket_t& socket() { return socket_; }

  std::string peer_gone() override {
    if (!monitor_) return "";
    take_disconnects();
    return std::exchange(gone_, {});
  }

  std::string write(std::span<const std::byte> head, std::span<const std::byte> tail, time_point deadline) override {
    socket_.set(zmq::sockopt::sndtimeo, std::max(1, milliseconds_until(deadline)));
    try {
      if (!socket_.send(zmq::buffer(head.data(), head.size()), zmq::send_flags::sndmore) ||
          !socket_.send(zmq::buffer(tail.data(), tail.size()), zmq::send_flags::none)) {
        return "the peer took no frame in time";
      }
    } catch (const zmq::error_t& e) {
      return std::string("sending a frame: ") + e.what();
    }
    return "";
  }

  // The engine's end also watches its disconnects while it waits: a stage that dies while it
  // computes a frame ends the wait at once (PAIR would reconnect and wait for the deadline).
  bool readable(std::chrono::milliseconds wait) override {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      std::vector<zmq::pollitem_t> items = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
      const size_t zap_item = items.size();
      if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
      const size_t monitor_item = items.size();
      if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
      zmq::poll(items, std::chrono::milliseconds(std::max(0, milliseconds_until(deadline))));
      if (zap_ && (items[zap_item].revents & ZMQ_POLLIN)) {
        refused_ = answer_zap_request(*zap_, allowed_);
        continue;  // the client's frame may follow at once
      }
      if (items[0].revents & ZMQ_POLLIN) return true;
      if (monitor_ && (items[monitor_item].revents & ZMQ_POLLIN)) {
        take_disconnects();
        if (!gone_.empty()) return false;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  std::string read_header(std::span<std::byte, stage_frame_header_bytes> header, time_point deadline) override {
    parts_.clear();
    part_ = offset_ = 0;
    if (!readable(std::chrono::milliseconds(milliseconds_until(deadline)))) {
      return gone_.empty() ? "no frame came by the deadline" : std::exchange(gone_, {});
    }
    do {
      parts_.emplace_back();
      if (!socket_.recv(parts_.back(), zmq::recv_flags::dontwait)) return "a frame ended early";
    } while (parts_.back().more());
    return read(header, deadline);
  }

  std::string read(std::span<std::byte> out, time_point) override {
    size_t done = 0;
    while (done < out.size()) {
      if (part_ >= parts_.size()) return "the frame holds fewer bytes than its header says";
      const zmq::message_t& part = parts_[part_];
      const size_t take = std::min(out.size() - done, part.size() - offset_);
      std::memcpy(out.data() + done, static_cast<const std::byte*>(part.data()) + offset_, take);
      done += take;
      offset_ += take;
      if (offset_ == part.size()) {
        ++part_;
        offset_ = 0;
      }
    }
    return "";
  }

  const std::string& last_refusal() const { return refused_; }

 private:
  // Drains the monitor's disconnect events into gone_.
  void take_disconnects() {
    zmq::message_t event;
    while (monitor_->recv(event, zmq::recv_flags::dontwait)) {
      zmq::message_t address;  // every event is two frames; the second names the peer's address
      (void)monitor_->recv(address, zmq::recv_flags::none);
      gone_ = "the connection to the stage closed";
    }
  }

  zmq::context_t context_;
  std::optional<zmq::socket_t> zap_;  // declared before socket_: bound first, closed last
  zmq::socket_t socket_;
  std::optional<zmq::socket_t> monitor_;  // the engine's end only: socket_'s disconnects
  std::set<std::string> allowed_;
  std::vector<zmq::message_t> parts_;  // the frame being read
  size_t part_ = 0, offset_ = 0;
  std::string refused_;
  std::string gone_;  // a disconnect seen and not yet reported
};

// "curve://HOST:PORT/KEY" -> "tcp://HOST:PORT", KEY; throws naming the text.
std::pair<std::string, std::string> split_curve_endpoint(const std::string& endpoint) {
  const std::string rest = endpoint.substr(curve_stage_scheme.size());
  const size_t slash = rest.find('/');
  if (!is_curve_stage_endpoint(endpoint) || slash == std::string::npos || rest.size() - slash - 1 != 40) {
    throw std::runtime_error(
        "pipeline stage endpoint \"" + endpoint +
        "\" is not curve://HOST:PORT/KEY (the stage's 40-character public key, as `troupe stage` prints it)");
  }
  return {"tcp://" + rest.substr(0, slash), rest.substr(slash + 1)};
}

}  // namespace

bool is_curve_stage_endpoint(std::string_view endpoint) { return endpoint.starts_with(curve_stage_scheme); }

std::unique_ptr<stage_channel> tcp_stage_channel(int fd) { return std::make_unique<tcp_channel>(fd); }

std::unique_ptr<stage_channel> curve_stage_server(const std::string& host, int port, const kv_channel_keys& keys,
                                                  uint64_t max_frame_bytes, std::string& endpoint) {
  auto channel = std::make_unique<curve_channel>(true, keys, max_frame_bytes);
  const std::string bind = "tcp://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                           (port == 0 ? std::string("*") : std::to_string(port));
  try {
    channel->socket().bind(bind);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("pipeline stage server: cannot bind " + bind + ": " + e.what());
  }
  const std::string bound = channel->socket().get(zmq::sockopt::last_endpoint);  // tcp://HOST:PORT
  endpoint = std::string(curve_stage_scheme) + bound.substr(6) + "/" + keys.public_key;
  return channel;
}

std::unique_ptr<stage_channel> curve_stage_client(const std::string& endpoint, const kv_channel_keys& keys,
                                                  uint64_t max_frame_bytes) {
  const auto [address, server_key] = split_curve_endpoint(endpoint);
  auto channel = std::make_unique<curve_channel>(false, keys, max_frame_bytes);
  channel->socket().set(zmq::sockopt::curve_serverkey, server_key);
  channel->socket().connect(address);
  return channel;
}

}  // namespace troupe
