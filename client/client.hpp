#pragma once
// A C++ client of the ZeroMQ plane: one DEALER socket, msgpack frames (docs/protocol.md).
// Not thread-safe (ZeroMQ sockets are not); use one client per thread.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "protocol/replies.hpp"
#include "protocol/requests.hpp"

namespace troupe {

// The server answered a request with an error reply.
class client_error : public std::runtime_error {
 public:
  client_error(error_code code, const std::string& message)
      : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code) {}
  error_code code() const { return code_; }

 private:
  error_code code_;
};

// A finished generation: the concatenation of every delta.
struct completion {
  std::string id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;
  usage_info usage;
  timing_info timings;
};

class client {
 public:
  // endpoint: a ZeroMQ address such as "tcp://127.0.0.1:5557". api_key is sent with every
  // request when not empty.
  client(const std::string& endpoint, std::string api_key = {});
  ~client();
  client(client&&) noexcept;
  client& operator=(client&&) noexcept;

  // Sends `request` (an id is made up when empty) and blocks until its last delta, calling
  // `on_delta` for each one as it arrives. Throws client_error on an error reply and
  // std::runtime_error when nothing arrives within the timeout.
  completion generate(generate_request request,
                      const std::function<void(const delta_reply&)>& on_delta = {});
  // Asks the server to stop request `id`; its last delta then says finish_reason "abort".
  void abort(const std::string& id);
  stats_reply stats();

  // Low-level use for many requests in flight on one socket.
  void send(client_request request);
  void send_raw(const std::string& frame);  // any bytes, for tests of the server's validation
  std::optional<server_reply> receive(std::chrono::milliseconds timeout);

  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  std::string next_id();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string api_key_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
};

}  // namespace troupe
