#pragma once
// A bounded TCP listener in front of a server that has no bound of its own. libzmq accepts every
// connection its listener is offered until the process has no descriptor left, and offers no
// per-listener cap nor a way to hand it an accepted socket (ZMQ_USE_FD adopts a listening socket,
// which it then drains the same way). So the ZeroMQ door's public port is this listener: it
// accepts through net/bounded_accept, admits each connection into a connection_guard (at most
// max_pending still in their handshake, the oldest closed for a newer one, each with a deadline;
// at most max_connections open) and relays its bytes, both ways and unchanged, to a Unix socket
// the server listens on in a private directory. The bytes are not read, so whatever the protocol
// authenticates (ZeroMQ's CURVE, an API key in a frame) works as before.
//
// Descriptors: a connection holds one while it has sent fewer than `greeting_bytes` (the relay
// opens the server's side only when the client speaks), three once relayed (the client's, the
// relay's Unix side and the server's accepted one). One thread, epoll, two 32 KiB buffers per
// relayed connection; a side whose buffer is full stops being read (back-pressure, no growth).

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "net/connection_guard.hpp"

namespace troupe {

struct relay_listener_options {
  std::string host = "127.0.0.1";  // a numeric address, "*" (every IPv4 interface) or a host name
  uint16_t port = 0;               // 0: one the kernel chooses (port() says which)
  int backlog = 4096;
  std::string target_path;  // the Unix socket the server listens on
  connection_limits limits;
  // A client is through its handshake, as far as the relay can tell, once it has sent this many
  // bytes (a ZMTP 3 greeting is 64; the server's own handshake timer covers the rest).
  size_t greeting_bytes = 64;
  std::string where = "relay";  // names the listener in logs and errors (its address follows)
};

class relay_listener {
 public:
  explicit relay_listener(relay_listener_options options);
  ~relay_listener();
  relay_listener(const relay_listener&) = delete;
  relay_listener& operator=(const relay_listener&) = delete;

  // Binds and listens (throws std::runtime_error naming the address when it cannot), then starts
  // the relay's thread.
  void start();
  // Closes the listener and every connection; joins the thread. Idempotent.
  void stop();

  uint16_t port() const { return port_; }
  // The address bound, "HOST:PORT" (an IPv6 host in brackets).
  const std::string& bound_address() const { return bound_address_; }
  connection_counts counts() const { return guard_ ? guard_->counts() : connection_counts{}; }
  const connection_limits& limits() const { return options_.limits; }
  // Connections whose server side is open now (each holds three descriptors).
  size_t num_relayed() const;

 private:
  struct state;
  void loop();

  relay_listener_options options_;
  std::shared_ptr<connection_guard> guard_;  // made by start(), named with the address bound
  std::unique_ptr<state> state_;
  uint16_t port_ = 0;
  std::string bound_address_;
  std::thread thread_;
};

}  // namespace troupe
