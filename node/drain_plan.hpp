#pragma once
// A graceful drain's course (SIGTERM to `troupe serve`), as a plain state machine the node's
// signal loop asks what to do next; no clock or thread of its own, so it is tested step by step.
//
//   serving ──begin──▶ draining ──all done──────────────────────────────▶ stopped
//                         │ timeout passed, or a second signal
//                         ▼
//                      ending (the rest failed with an error) ──flushed, or flush_limit──▶ stopped
//
// While draining, admission is closed (the node closes it at begin) and running requests go on.
// At the drain's end the ones still running are failed, each with an error its client sees (an
// SSE error event and `[DONE]`, an error JSON, a ZeroMQ error reply); the doors are stopped only
// once they have written those, or flush_limit later.

#include <chrono>
#include <optional>
#include <string>

namespace troupe {

class drain_plan {
 public:
  using clock = std::chrono::steady_clock;
  enum class phase { serving, draining, ending, stopped };
  enum class action {
    wait,          // ask again a little later
    end_the_rest,  // fail every request still running with end_reason(); ask again
    stop,          // stop the doors and the stages
  };

  // `timeout`: how long running requests may go on; `flush_limit`: how long the doors may take
  // to write the errors of the requests ended at its end.
  drain_plan(std::chrono::milliseconds timeout, std::chrono::milliseconds flush_limit);

  // Starts the drain at `now` (from serving only; later calls change nothing).
  void begin(clock::time_point now);
  // What to do at `now`, with `num_running` requests still held by the doors, `interrupted` when
  // a second signal came (the drain ends at once).
  action next(clock::time_point now, size_t num_running, bool interrupted);

  phase current() const { return phase_; }
  // What the clients of the requests ended at the drain's end are told.
  const std::string& end_reason() const { return end_reason_; }
  // What the doors tell requests that come while draining.
  std::string refusal() const;

 private:
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds flush_limit_;
  phase phase_ = phase::serving;
  clock::time_point deadline_{};  // of the current phase
  std::string end_reason_;
};

}  // namespace troupe
