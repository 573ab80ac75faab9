#pragma once
// What the router sent each request's detokenizer, kept so that a detokenizer lost with its node
// can be replaced without the client noticing (docs/design/cluster.md, "Failover"). A detokenizer
// holds per-request state (the incremental decoder's unfinished bytes, the stop-string matcher's
// held tail) that dies with it, as do the token batches still in its mailbox. The ledger keeps
// every delta (and failure) forwarded for a request while it runs, and for `keep_ended` after its
// end (its final may have died in the lost detokenizer's mailbox). Given how many output tokens
// each client already has (the frontend counts them), resume() says what the new detokenizer
// needs: the tokens to spell silently (detokenizer_resume_msg) and the deltas to send again.
// Plain class, used on the router's thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stages/detokenizer_resume.hpp"
#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

class detokenizer_ledger {
 public:
  // Ended requests are forgotten after keep_ended, and the oldest first beyond max_ended.
  explicit detokenizer_ledger(std::chrono::nanoseconds keep_ended = std::chrono::seconds(30), size_t max_ended = 65536)
      : keep_ended_(keep_ended.count()), max_ended_(max_ended) {}

  // Notes a batch on its way to a detokenizer, at `now` (steady clock, ns).
  void record(const token_batch& batch, timestamp_ns now);

  // The requests (running, or ended within keep_ended) whose detokenizer is shard `shard` of
  // `num_shards` (detokenizer_of).
  std::vector<int64_t> requests_of(size_t shard, size_t num_shards) const;

  struct resumption {
    std::vector<detokenizer_resume_msg> primes;  // to the new detokenizer first, in this order
    token_batch replay;                          // then this
  };
  // What a new detokenizer must be sent for `delivered`: (request id, output tokens its client
  // has; -1 when the client has had the request's end, which leaves nothing to send).
  resumption resume(const std::vector<std::pair<int64_t, int32_t>>& delivered) const;

  size_t size() const { return entries_.size(); }

 private:
  struct entry {
    std::vector<std::string> stop;
    bool skip_special_tokens = true;
    bool seen_first_delta = false;
    std::vector<token_delta> deltas;  // as forwarded
    std::vector<request_timeline> timelines;
    std::optional<request_failed> failure;
    bool ended = false;
  };
  void ended(int64_t request_id, entry& e, timestamp_ns now);
  void forget_old(timestamp_ns now);

  timestamp_ns keep_ended_;
  size_t max_ended_;
  std::unordered_map<int64_t, entry> entries_;
  std::deque<std::pair<timestamp_ns, int64_t>> ended_order_;  // oldest first
};

}  // namespace troupe
