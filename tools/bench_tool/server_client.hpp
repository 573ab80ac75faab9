#pragma once
// How the bench talks to a server: a factory of per-thread sessions (ZeroMQ sockets and HTTP
// connections are not shared between threads), each sending one request at a time and timing
// what streams back.

#include <chrono>
#include <memory>
#include <string>

#include "tools/bench_tool/request_record.hpp"
#include "tools/bench_tool/workload.hpp"

namespace troupe::bench_tool {

using bench_clock = std::chrono::steady_clock;

struct request_settings {
  double temperature = 0.0;
  bool ignore_eos = true;           // so output lengths are as asked, where the server supports it
  int num_speculative_tokens = -1;  // sent when >= 0 (Troupe's extension); -1: the server's default
  std::chrono::seconds timeout{600};
};

class server_session {
 public:
  virtual ~server_session() = default;
  // Sends `request` and blocks until its reply has ended or failed; times are taken from
  // `run_start`. Never throws: a failure is a record with ok false and the reason.
  virtual request_record send(const bench_request& request, bench_clock::time_point run_start) = 0;
};

class server_client {
 public:
  virtual ~server_client() = default;
  virtual std::unique_ptr<server_session> open_session() = 0;
  // True when the server answers (a stats request, GET /v1/models): for waiting on a server the
  // bench started itself.
  virtual bool answers() = 0;
  // How prompts go on the wire.
  virtual prompt_form form() const = 0;
};

// Troupe's ZeroMQ protocol (docs/protocol.md): streamed deltas, usage in the last one.
std::unique_ptr<server_client> make_zmq_client(const std::string& endpoint, const std::string& api_key,
                                               const request_settings& settings);

// The OpenAI HTTP API, streaming: /v1/completions, or /v1/chat/completions when `chat`.
// base_url: http://host:port, with or without a trailing /v1. An empty model is asked of
// GET /v1/models (the first one).
std::unique_ptr<server_client> make_openai_client(const std::string& base_url, const std::string& api_key,
                                                  std::string model, bool chat, const request_settings& settings);

}  // namespace troupe::bench_tool
