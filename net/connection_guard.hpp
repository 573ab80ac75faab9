#pragma once
// The limits of one listening socket, in one place for every port Troupe owns (the cluster's TLS
// ports, the admin door, the KV receiver): how many connections may still be in their handshake,
// how many may be open at all, and how long a handshake may take. A peer that opens connections
// and says nothing (or drips a byte now and then) holds at most `max_pending` slots, each for at
// most `handshake_timeout`; it can neither exhaust the process's descriptors nor hold its
// shutdown.
//
// The guard does not own the sockets. Their owner admits each accepted connection (a ticket),
// reports it `established` when its handshake is done and `closed` *before* it closes the
// descriptor; the guard ends a connection by shutting its socket down (shutdown(2), under the
// guard's lock, so never a descriptor already closed and reused): the owner's next read sees the
// end of the stream and closes it the ordinary way. Thread-safe.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "net/refusal_log.hpp"

namespace troupe {

struct connection_limits {
  size_t max_pending = 64;       // connections not yet through their handshake
  size_t max_connections = 256;  // every open connection of the listener, pending or not
  std::chrono::milliseconds handshake_timeout{5000};
};

struct connection_counts {
  size_t num_pending = 0;
  size_t num_established = 0;
  uint64_t num_admitted = 0;
  uint64_t num_refused = 0;    // closed at once: the listener was full
  uint64_t num_evicted = 0;    // pending ones shut to make room for a newer one
  uint64_t num_timed_out = 0;  // pending ones shut at their handshake deadline
};

class connection_guard {
 public:
  connection_guard(connection_limits limits, std::string where);

  // A connection just accepted on `fd` from `peer`: its ticket (never 0), or 0 when the listener
  // has max_connections open already (the caller closes `fd`; the refusal is logged). When
  // max_pending connections are in their handshake, the oldest of them is shut down to make room:
  // a flood cannot keep a member that connects now from its handshake, only delay it. The ticket
  // of the one shut to make room goes to `*evicted` (0: none), so that an owner on this thread can
  // close it now rather than at its next event: a flood accepted in a batch would otherwise hold
  // a batch of shut descriptors at once.
  uint64_t admit(int fd, std::string_view peer, uint64_t* evicted = nullptr);
  // The connection's handshake is done: no deadline from now on.
  void established(uint64_t ticket);
  // The owner closes the connection next (call before close(2)). Unknown tickets are ignored.
  void closed(uint64_t ticket);
  // Shuts down the pending connections whose handshake deadline has passed; how many. The owner
  // calls it periodically (every ~100 ms) and it flushes the refusal log's summary too.
  size_t expire(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  // Shuts down a connection now (e.g. a peer that sent something no handshake allows), counted
  // under `kind` in the refusal log.
  void refuse(uint64_t ticket, std::string_view kind, std::string_view reason);

  // Shuts down every open connection (pending or established): a listener that stops ends the
  // reads its thread may be blocked in. Their owners still close them.
  void shut_all();

  connection_counts counts() const;
  const connection_limits& limits() const { return limits_; }
  refusal_log& log() { return log_; }
  const std::string& where() const { return where_; }

 private:
  struct entry {
    int fd = -1;
    std::string peer;
    std::chrono::steady_clock::time_point deadline;
    bool pending = true;
    bool shut = false;  // shut down by the guard; still open until its owner closes it
    std::list<uint64_t>::iterator in_pending;
  };
  void shut_locked(entry& e);

  const connection_limits limits_;
  const std::string where_;
  refusal_log log_;
  mutable std::mutex mutex_;
  uint64_t next_ticket_ = 1;
  std::unordered_map<uint64_t, entry> entries_;
  std::list<uint64_t> pending_;  // oldest first; only entries still pending and not shut
  size_t num_open_ = 0;          // entries not shut
  connection_counts counts_;
};

}  // namespace troupe
