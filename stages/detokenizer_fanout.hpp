#pragma once
// The router's side of its detokenizers: which detokenizer each part of an engine's token batch
// goes to, what the ledger must note on the way, and the resumption of a detokenizer that was
// replaced after its node was lost (docs/design/cluster.md, "Failover"). While a replacement is
// being resumed (the router asked the frontend what each client already has), the parts meant for
// it are held in the ledger and the resumption sends them; a second replacement before the
// frontend answers supersedes the first. Plain class on the router's thread; the actor only sends
// what it says.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stages/detokenizer_ledger.hpp"
#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

class detokenizer_fanout {
 public:
  // `keep_ledger`: whether detokenizers can be replaced (a cluster that places them on nodes that
  // may be lost); without the ledger a replacement starts empty and its requests' text is lost.
  detokenizer_fanout(size_t num_detokenizers, bool keep_ledger);

  size_t num_detokenizers() const { return resumptions_.size(); }
  bool keeps_ledger() const { return ledger_ != nullptr; }
  bool resuming(size_t index) const { return resumptions_.at(index).resuming; }

  struct part {
    size_t detokenizer;
    token_batch batch;
  };
  // `batch` split by owning detokenizer, noted in the ledger at `now`; the parts to send now, in
  // detokenizer order. A part whose detokenizer is being resumed is not among them.
  std::vector<part> route(token_batch batch, timestamp_ns now);

  // A replacement for detokenizer `index` was placed: the requests whose clients the frontend must
  // be asked about, and the ticket that finish_resume() takes with the answer. Until then its parts
  // are held (with a ledger; without one they go to the replacement at once).
  struct resume_ticket {
    size_t detokenizer = 0;
    uint64_t generation = 0;
    std::vector<int64_t> asked;
  };
  resume_ticket begin_resume(size_t index);

  // The frontend's answer for `ticket`: output tokens each asked request's client has (-1: it had
  // the end). What the replacement must be sent, in order; nullopt when there is nothing to send
  // (the ticket was superseded by a later replacement, or there is no ledger). Requests that
  // arrived after begin_resume() count as having nothing yet.
  std::optional<detokenizer_ledger::resumption> finish_resume(const resume_ticket& ticket,
                                                              const std::unordered_map<int64_t, int32_t>& delivered);

 private:
  struct resumption_state {
    bool resuming = false;
    uint64_t generation = 0;
  };
  std::unique_ptr<detokenizer_ledger> ledger_;
  std::vector<resumption_state> resumptions_;
};

}  // namespace troupe
