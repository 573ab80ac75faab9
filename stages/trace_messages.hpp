#pragma once
// The messages that fetch recent scheduler steps for a trace (GET /debug/trace): the frontend
// asks the router, the router asks every engine instance and answers with all their steps.
//
//   frontend ─trace_query▶ router ─trace_query▶ scheduler ─trace_answer▶ router ─trace_answer▶ frontend
//
// A step's start travels as an age (how long before the answer was sent), never as a stamp: the
// schedulers' steady clocks may be other hosts'. The router turns each instance's ages into ages
// before its own answer with the round trip it measured (docs/design/serving.md, "Metrics,
// traces and inspection").

#include <cstdint>
#include <string>
#include <vector>

#include "stages/stage_clock.hpp"

namespace troupe {

// One scheduler step: from its plan being sent to the worker (or the previous step's result, when
// that came later) to its result coming back.
struct step_event {
  int32_t instance = 0;  // the engine instance (set by the router)
  uint64_t step_id = 0;
  duration_ns age_ns = 0;      // the step's start, this long before the answer carrying it was sent
  duration_ns elapsed_ns = 0;  // the scheduler's clock: plan sent -> result received
  duration_ns compute_ns = 0;  // the worker's clock: plan received -> result ready
  // Batch composition, told from the chunk alone: a sequence is in decode when its chunk is one
  // token on top of computed ones (its last sample), else in prefill. A prompt's last chunk of
  // exactly one token (after a prefix-cache hit or chunking) therefore counts as decode.
  int32_t num_prefill_sequences = 0;
  int32_t num_decode_sequences = 0;
  int32_t num_prefill_tokens = 0;
  int32_t num_decode_tokens = 0;
  std::vector<int64_t> request_ids;  // [sequences], in the plan's order
};

struct trace_query {
  uint64_t tag = 0;
  duration_ns window_ns = 0;  // steps that started at most this long ago
};

// An engine instance that answered, and the node it runs on (to name its row in the trace).
struct trace_instance {
  int32_t instance = 0;
  std::string node;
  // How far its steps may lie off the receiver's clock: half the round trip of every query they
  // crossed (the router's to the instance, then the door's to the router), summed.
  duration_ns clock_error_ns = 0;
};

struct trace_answer {
  uint64_t tag = 0;
  std::vector<step_event> steps;
  std::vector<trace_instance> instances;
  std::string unavailable;  // non-empty: why no instance answered
};

}  // namespace troupe
