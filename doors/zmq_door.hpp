#pragma once
// The client plane's door: owns the ZeroMQ ROUTER socket on its own thread, which only polls:
// it decodes and checks every frame, asks its zmq_request_table what a request or a reply event
// means, and sends what the table returns (replies to clients, work to the stages). Plain class:
// the actor system reaches it through door_downstream (out) and post() (in).
//
// Client-gone detection: libzmq's ROUTER_NOTIFY is a draft API (absent from Debian's build), so
// the door watches the ROUTER's socket monitor for DISCONNECTED events, which name the file
// descriptor, and maps descriptors to routing ids from each message's ZMQ_SRCFD (absent from a
// ZMTP/1.0 peer's messages: such a peer is served, but its disconnect goes unnoticed).
//
// Nothing a peer sends ends the door's thread: a failure is contained to its message, logged.
//
// Its listener is not libzmq's: libzmq accepts until the process has no descriptor left, with no
// cap. A tcp:// endpoint is the door's relay_listener (bounded accept, pending and open caps,
// handshake deadlines), which relays each connection's bytes, unchanged, to the ROUTER bound on
// a Unix socket in a private directory (0700: only this user can reach it past the relay).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "doors/door_events.hpp"
#include "doors/request_admission.hpp"
#include "doors/tenant_table.hpp"
#include "net/connection_guard.hpp"
#include "protocol/protocol_limits.hpp"
#include "stages/messages.hpp"

namespace troupe {

struct zmq_door_options {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: none asked for
  // [[tenants]]: their keys are let in too (and pin the request's tenant), their defaults fill
  // what a generate request leaves unset. Null: none.
  std::shared_ptr<const tenant_table> tenants;
  protocol_limits limits;
  int max_prompt_tokens = 1 << 20;  // from the model's context; a token-id prompt this long is refused early
  int listen_backlog = 4096;        // TCP connections queued before accept (capped by net.core.somaxconn)
  // A connection must finish ZeroMQ's greeting and handshake within this, or it is closed: by
  // the door's relay while the client has not sent its greeting, by libzmq after (libzmq's own
  // default is 30 s; docs/reliability.md).
  int handshake_timeout_ms = 5000;
  // A tcp:// endpoint's connections go through the door's own listener (net/relay_listener.hpp):
  // at most this many still in their handshake (the oldest closed for a newer one) ...
  size_t max_pending_handshakes = 64;
  // ... and at most this many open; 0: a sixth of the open-files limit's descriptors, three
  // per connection (the client's, the relay's and libzmq's), so a flood cannot take the
  // descriptors the engine needs.
  size_t max_connections = 0;
  // [frontend] access_log: a line for each request refused here, as the reply router writes one
  // for each that ends (doors/access_log.hpp).
  bool access_log = false;
};

class zmq_door : public door_inbox {
 public:
  // `admission` (shared with the other doors) hands out request ids and bounds the requests in
  // flight: beyond it, `overloaded`, before anything is allocated.
  zmq_door(zmq_door_options options, door_downstream& downstream, request_admission& admission);
  ~zmq_door();
  zmq_door(const zmq_door&) = delete;
  zmq_door& operator=(const zmq_door&) = delete;

  // Binds the socket (throws std::runtime_error naming the endpoint when it cannot) and starts
  // the thread.
  void start();
  void stop();
  // The endpoint bound by start(): with a wildcard port (tcp://127.0.0.1:*), the port chosen.
  const std::string& bound_endpoint() const { return bound_endpoint_; }
  // The relay's counts (all zero for an endpoint that is not tcp://).
  connection_counts connections() const;
  // Thread-safe: replies from the stages, sent on by the door's thread.
  void post(door_event event) override;

 private:
  struct state;
  void loop();

  zmq_door_options options_;
  std::string bound_endpoint_;
  door_downstream& downstream_;
  std::unique_ptr<state> state_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace troupe
