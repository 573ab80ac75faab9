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

#include "runtime/messages.hpp"
#include "runtime/protocol/protocol_limits.hpp"

namespace troupe {

struct frontend_options {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: none asked for
  protocol_limits limits;
  int max_requests_in_flight = 8192;  // beyond: `overloaded`, before anything is allocated
  int max_prompt_tokens = 1 << 20;    // from the model's context; a token-id prompt this long is refused early
};

// Where the frontend sends work. Called from the frontend's thread only.
class frontend_downstream {
 public:
  virtual ~frontend_downstream() = default;
  virtual void submit(tokenize_request request) = 0;
  virtual void abort(int64_t request_id) = 0;
  virtual void query_stats(uint64_t tag) = 0;
};

using frontend_event = std::variant<text_batch, request_failed, stats_answer>;

class frontend {
 public:
  frontend(frontend_options options, frontend_downstream& downstream);
  ~frontend();
  frontend(const frontend&) = delete;
  frontend& operator=(const frontend&) = delete;

  // Binds the socket (throws std::runtime_error naming the endpoint when it cannot) and starts
  // the thread.
  void start();
  void stop();
  // Thread-safe: replies from the stages, sent on by the frontend's thread.
  void post(frontend_event event);

  int64_t num_requests_in_flight() const { return num_in_flight_.load(); }

 private:
  struct state;
  void loop();

  frontend_options options_;
  frontend_downstream& downstream_;
  std::unique_ptr<state> state_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> num_in_flight_{0};
};

}  // namespace troupe
