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

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "doors/door_events.hpp"
#include "doors/request_admission.hpp"
#include "protocol/protocol_limits.hpp"
#include "stages/messages.hpp"

namespace troupe {

struct zmq_door_options {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: none asked for
  protocol_limits limits;
  int max_prompt_tokens = 1 << 20;    // from the model's context; a token-id prompt this long is refused early
  int listen_backlog = 4096;          // TCP connections queued before accept (capped by net.core.somaxconn)
  // A connection must finish ZeroMQ's greeting and handshake within this, or libzmq closes it:
  // the door's listener is libzmq's, and nothing else frees the descriptor of a peer that
  // connects and says nothing (libzmq's own default is 30 s; docs/reliability.md).
  int handshake_timeout_ms = 5000;
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
