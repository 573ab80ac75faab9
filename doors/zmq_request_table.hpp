#pragma once
// The ZeroMQ door's bookkeeping, without a socket: which requests are live for which client
// (its routing id) under which client-chosen id, which connection each client came on, the stats
// queries waiting for their answer, and the whole completion of a request that does not stream.
// Every call returns what the door must send: replies addressed by routing id, and work for the
// stages. Plain class, used by the door's one thread.
//
// A client is gone when its connection closes (on_disconnected, by the descriptor the socket
// monitor names) or when the door is told so (on_client_gone): its requests are aborted, and
// what still comes back for them is dropped, not sent.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "doors/door_events.hpp"
#include "doors/access_log.hpp"
#include "doors/request_admission.hpp"
#include "protocol/replies.hpp"
#include "protocol/requests.hpp"
#include "stages/messages.hpp"

namespace troupe {

struct addressed_reply {
  std::string routing_id;
  server_reply reply;
};

class zmq_request_table {
 public:
  struct outputs {
    std::vector<addressed_reply> replies;  // to clients, in this order
    std::vector<refusal_entry> refusals;   // generate requests refused before admission (the access log's)
    std::optional<tokenize_request> submit;
    std::vector<int64_t> aborts;
    std::optional<uint64_t> stats_query;
  };

  // Stats queries a client may leave waiting, all clients together: beyond it, `overloaded`.
  static constexpr size_t max_stats_waiters = 1024;

  // `admission` (shared with the other doors) hands out request ids and bounds the requests in
  // flight. A token-id prompt of `max_prompt_tokens` or more leaves no room to generate.
  zmq_request_table(request_admission& admission, int max_prompt_tokens);
  zmq_request_table(const zmq_request_table&) = delete;
  zmq_request_table& operator=(const zmq_request_table&) = delete;

  // A request from `routing_id`, already decoded and its key accepted by the door. `arrival` and
  // `now` are readings of this process's steady clock: the door times ttft and e2e itself, since
  // the stages' clocks may be other hosts'.
  outputs on_request(const std::string& routing_id, client_request request, timestamp_ns arrival);
  // Replies from the stages, received at `now`.
  outputs on_event(const door_event& event, timestamp_ns now = steady_now_ns());
  // The client will not read its replies: abort what it has in flight.
  outputs on_client_gone(const std::string& routing_id);

  // Connections. A routing id seen on descriptor `fd` (a new peer there, or one it already
  // knows); the door handles disconnects queued before it records a new one, since a closed
  // connection's descriptor may be reused by the next.
  bool knows_peer(int fd, const std::string& routing_id) const;
  void add_peer(int fd, const std::string& routing_id);
  // The connection on `fd` closed: every client on it is gone.
  outputs on_disconnected(int fd);

  size_t num_live_requests() const { return requests_.size(); }
  size_t num_stats_waiting() const { return stats_waiters_.size(); }
  size_t num_connections() const { return routing_ids_by_fd_.size(); }

 private:
  struct live_request {
    std::string routing_id;
    std::string client_id;
    bool stream = true;
    bool want_logprobs = false;
    bool want_prompt_logprobs = false;  // and not yet sent: they come with the first token
    bool client_gone = false;
    timestamp_ns arrival = 0;
    timestamp_ns first_tokens = 0;  // when the first delta with tokens came back; 0 before
    delta_reply pending;            // the whole completion so far when not streaming
  };
  struct stats_waiter {
    std::string routing_id;
    std::string id;
  };

  void on_text(const text_delta& d, timestamp_ns now, outputs& out);
  void gone(const std::string& routing_id, outputs& out);
  // Drops a finished or failed request and returns its in-flight slot.
  void forget(int64_t request_id);
  static void refuse(outputs& out, const std::string& routing_id, std::string id, error_code code, std::string message);

  request_admission& admission_;
  int max_prompt_tokens_;
  std::unordered_map<int64_t, live_request> requests_;
  std::map<std::pair<std::string, std::string>, int64_t> by_client_id_;  // (routing id, client id)
  std::unordered_map<std::string, std::unordered_set<int64_t>> by_routing_id_;
  std::unordered_map<int, std::unordered_set<std::string>> routing_ids_by_fd_;
  std::unordered_map<uint64_t, stats_waiter> stats_waiters_;  // by tag
};

}  // namespace troupe
