#pragma once
// A time window of serving as Chrome trace-event JSON ({"traceEvents": [...]}, as chrome://tracing
// and Perfetto load it): one process "requests" with a thread per finished request (its spans:
// request, tokenize, queue, prefill, decode, and each scheduler step it was in), and one process
// per engine instance with a thread of its steps (batch composition in their args). "X" complete
// events, ts and dur in whole microseconds from the window's start; "M" events name the processes and
// threads. Plain function of plain data: the HTTP door gathers the data, this lays it out.

#include <string>
#include <vector>

#include "doors/request_trace_log.hpp"
#include "stages/stage_clock.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// A step with its start on the controller's clock (its age subtracted from the answer's arrival).
struct placed_step {
  timestamp_ns start = 0;
  step_event step;
};

struct trace_window {
  timestamp_ns begin = 0;  // the controller's clock: ts 0
  timestamp_ns end = 0;
  std::vector<request_record> requests;  // finished within the window
  std::vector<placed_step> steps;
  std::vector<trace_instance> instances;
};

// A named stretch of one request's life, on the controller's clock.
struct request_phase {
  const char* name = "";
  timestamp_ns begin = 0;
  timestamp_ns end = 0;
};

// The phases of a request, placed from its stamps and its stages' durations (each laid end to
// end from its arrival: the stages' clocks are not the controller's, only their durations are
// known). Disaggregated serving adds its "kv_transfer" phase here.
std::vector<request_phase> request_phases(const request_record& r);

std::string build_chrome_trace(const trace_window& window);

}  // namespace troupe
