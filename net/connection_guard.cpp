#include "net/connection_guard.hpp"

#include <sys/socket.h>

namespace troupe {

connection_guard::connection_guard(connection_limits limits, std::string where)
    : limits_(limits), where_(where), log_(std::move(where)) {}

uint64_t connection_guard::admit(int fd, std::string_view peer, uint64_t* evicted_ticket) {
  if (evicted_ticket) *evicted_ticket = 0;
  std::string refusal;
  std::string evicted;
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    if (num_open_ >= limits_.max_connections) {
      ++counts_.num_refused;
      refusal = "a connection from " + std::string(peer) + " beyond the listener's " +
                std::to_string(limits_.max_connections) + " open connections";
    } else {
      if (pending_.size() >= limits_.max_pending) {
        entry& oldest = entries_.at(pending_.front());
        if (evicted_ticket) *evicted_ticket = pending_.front();
        ++counts_.num_evicted;
        evicted = oldest.peer;
        shut_locked(oldest);
      }
      ticket = next_ticket_++;
      entry e;
      e.fd = fd;
      e.peer = std::string(peer);
      e.deadline = std::chrono::steady_clock::now() + limits_.handshake_timeout;
      pending_.push_back(ticket);
      e.in_pending = std::prev(pending_.end());
      entries_.emplace(ticket, std::move(e));
      ++num_open_;
      ++counts_.num_admitted;
      counts_.num_pending = pending_.size();
    }
  }
  if (!evicted.empty()) {
    log_.refuse("still in its handshake when the pending slots were full",
                "the oldest of " + std::to_string(limits_.max_pending) +
                    " connections still in their handshake (from " + evicted + ") closed to make room");
  }
  if (ticket != 0) return ticket;
  log_.refuse("over the open-connection limit", refusal);
  return 0;
}

void connection_guard::established(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(ticket);
  if (it == entries_.end() || !it->second.pending) return;
  entry& e = it->second;
  e.pending = false;
  if (!e.shut) {
    pending_.erase(e.in_pending);
    ++counts_.num_established;
  }
  counts_.num_pending = pending_.size();
}

void connection_guard::closed(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  entry& e = it->second;
  if (!e.shut) {
    if (e.pending) {
      pending_.erase(e.in_pending);
    } else {
      --counts_.num_established;
    }
    --num_open_;
  }
  entries_.erase(it);
  counts_.num_pending = pending_.size();
}

void connection_guard::shut_locked(entry& e) {
  if (e.shut) return;
  e.shut = true;
  if (e.pending) {
    pending_.erase(e.in_pending);
  } else {
    --counts_.num_established;
  }
  --num_open_;
  counts_.num_pending = pending_.size();
  ::shutdown(e.fd, SHUT_RDWR);
}

size_t connection_guard::expire(std::chrono::steady_clock::time_point now) {
  size_t num_expired = 0;
  std::string first_peer;
  {
    std::lock_guard lock(mutex_);
    while (!pending_.empty()) {
      entry& e = entries_.at(pending_.front());
      if (e.deadline > now) break;  // pending_ is in admission order, so in deadline order
      if (first_peer.empty()) first_peer = e.peer;
      shut_locked(e);
      ++counts_.num_timed_out;
      ++num_expired;
    }
  }
  const std::string kind = "no handshake within " + std::to_string(limits_.handshake_timeout.count()) + " ms";
  for (size_t i = 0; i < num_expired; ++i) log_.refuse(kind, kind + " from " + first_peer);
  log_.flush();
  return num_expired;
}

void connection_guard::refuse(uint64_t ticket, std::string_view kind, std::string_view reason) {
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(ticket);
    if (it == entries_.end()) return;
    shut_locked(it->second);
  }
  log_.refuse(kind, reason);
}

void connection_guard::shut_all() {
  std::lock_guard lock(mutex_);
  for (auto& [ticket, e] : entries_) shut_locked(e);
}

connection_counts connection_guard::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

}  // namespace troupe
