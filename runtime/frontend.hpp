#pragma once
// The client plane's door: owns the ZeroMQ ROUTER socket on its own thread, decodes and checks
// every frame, hands valid requests downstream and sends replies back. Plain class: the actor
// system reaches it through frontend_downstream (out) and post() (in), so it is testable alone.
//
// Client-gone detection: libzmq's ROUTER_NOTIFY is a draft API (absent from Debian's build), so
// the frontend watches the ROUTER's socket monitor for DISCONNECTED events, which name the file
// descriptor, and maps descriptors to routing ids from each message's ZMQ_SRCFD.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "runtime/door_events.hpp"
#include "runtime/messages.hpp"
#include "runtime/protocol/protocol_limits.hpp"
#include "runtime/request_admission.hpp"

namespace troupe {

struct frontend_options {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: none asked for
  protocol_limits limits;
  int max_prompt_tokens = 1 << 20;    // from the model's context; a token-id prompt this long is refused early
};

class frontend : public door_inbox {
 public:
  // `admission` (shared with the other doors) hands out request ids and bounds the requests in
  // flight: beyond it, `overloaded`, before anything is allocated.
  frontend(frontend_options options, frontend_downstream& downstream, request_admission& admission);
  ~frontend();
  frontend(const frontend&) = delete;
  frontend& operator=(const frontend&) = delete;

  // Binds the socket (throws std::runtime_error naming the endpoint when it cannot) and starts
  // the thread.
  void start();
  void stop();
  // Thread-safe: replies from the stages, sent on by the frontend's thread.
  void post(frontend_event event) override;

 private:
  struct state;
  void loop();

  frontend_options options_;
  frontend_downstream& downstream_;
  request_admission& admission_;
  std::unique_ptr<state> state_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace troupe
