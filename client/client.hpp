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

// No server took the connection within the connect timeout (nothing listens at the endpoint, or
// it cannot be reached), or one stopped answering for the request timeout. what() names the
// endpoint and the time waited.
class client_unreachable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  // `on_delta` for each one as it arrives. Throws client_error on an error reply, and
  // client_unreachable when no connection is made within the connect timeout, nothing arrives
  // within the request timeout, or the connection closes before the answer (a peer that is not a
  // troupe ZeroMQ door, or a server that went away: its reply can no longer come).
  completion generate(generate_request request, const std::function<void(const delta_reply&)>& on_delta = {});
  // Asks the server to stop request `id`; its last delta then says finish_reason "abort".
  void abort(const std::string& id);
  stats_reply stats();

  // Low-level use for many requests in flight on one socket.
  void send(client_request request);
  void send_raw(const std::string& frame);  // any bytes, for tests of the server's validation
  std::optional<server_reply> receive(std::chrono::milliseconds timeout);

  // The request timeout: the longest wait for the next reply (a delta, or the whole answer of a
  // request that does not stream). 10 minutes unless set.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // The longest wait for a connection before a message can go out (ZeroMQ connects in the
  // background and would otherwise queue forever). 5 seconds unless set.
  void set_connect_timeout(std::chrono::milliseconds timeout);
  const std::string& endpoint() const { return endpoint_; }
  std::string next_id();

 private:
  // The next reply for a blocking call, waiting at most `timeout`; throws client_unreachable
  // naming `what` when none comes or the connection is lost first.
  std::optional<server_reply> receive_answer(std::chrono::milliseconds timeout, const std::string& what);

  struct impl;
  std::unique_ptr<impl> impl_;
  std::string endpoint_;
  std::string api_key_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
  std::chrono::milliseconds connect_timeout_{std::chrono::seconds(5)};
};

}  // namespace troupe
