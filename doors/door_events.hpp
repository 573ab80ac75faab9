#pragma once
// The two directions between a client door (ZeroMQ or HTTP) and the stages, as plain interfaces
// so a door is testable without an actor system.

#include <cstdint>
#include <variant>

#include "stages/messages.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// Where a door sends work. Thread-safe: the HTTP door calls it from many connection threads.
class door_downstream {
 public:
  virtual ~door_downstream() = default;
  virtual void submit(tokenize_request request) = 0;
  virtual void abort(int64_t request_id) = 0;
  virtual void query_stats(uint64_t tag) = 0;
  // Recent scheduler steps of every engine instance (a trace_answer comes back with `tag`).
  virtual void query_trace(uint64_t tag, duration_ns window) = 0;
};

// What comes back from the stages for a door's requests.
using door_event = std::variant<text_batch, request_failed, stats_answer, trace_answer>;

// A door's way in for those events. Thread-safe; must not block for long (the caller is the
// actor that routes replies for every door).
class door_inbox {
 public:
  virtual ~door_inbox() = default;
  virtual void post(door_event event) = 0;
};

}  // namespace troupe
