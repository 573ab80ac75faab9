#pragma once
// Every message that travels between stages, one plain struct each. Their CAF `inspect`
// overloads, which let a message cross to another node, are in stages/message_inspect.hpp,
// included only by actors and nodes: the plain classes compile without CAF.
//
//   frontend ─tokenize_request▶ tokenizer ─schedule_request▶ scheduler ─step_plan▶ worker
//   worker ─step_done▶ scheduler ─token_batch▶ detokenizer ─text_batch▶ frontend
//   frontend ─abort_request_msg / stats_query▶ scheduler ─stats_answer▶ frontend
//   detokenizer ─stop_request_msg▶ scheduler (a stop string matched)
//   tokenizer, scheduler (a refusal), detokenizer (a failed step) ─request_failed▶ frontend
//   node ─stage_failure_drill▶ any stage (a debug drill: the stage fails)

#include <cstdint>
#include <string>
#include <vector>

#include "engine/step_plan.hpp"
#include "engine/token_delta.hpp"
#include "protocol/replies.hpp"
#include "protocol/requests.hpp"
#include "protocol/sampling_params.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

enum class prompt_kind : uint8_t { text, token_ids, messages };

struct tokenize_request {
  int64_t request_id = 0;
  prompt_kind kind = prompt_kind::text;
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  std::vector<chat_message> messages;
  sampling_params sampling;
  int32_t priority = 0;
  timestamp_ns arrival = 0;
};

struct schedule_request {
  int64_t request_id = 0;
  std::vector<int32_t> prompt_ids;
  sampling_params sampling;
  int32_t priority = 0;
  timestamp_ns arrival = 0;
  timestamp_ns tokenized = 0;
  // Tokens this request already generated elsewhere (failover: another engine died mid-request);
  // empty for a fresh request. The scheduler continues after them (scheduler::add_request).
  std::vector<int32_t> resumed_output_ids;
};

// The worker's answer to a step_plan; `error` non-empty when the step failed.
struct step_done {
  step_result result;
  timestamp_ns begin = 0;
  timestamp_ns end = 0;
  std::string error;
};

// The per-request timeline the scheduler keeps; attached to a request's final delta.
struct request_timeline {
  timestamp_ns arrival = 0;
  timestamp_ns tokenized = 0;
  timestamp_ns first_scheduled = 0;
  timestamp_ns first_step_begin = 0;
  timestamp_ns first_step_end = 0;
  timestamp_ns last_step_end = 0;
  int32_t num_steps = 0;
};

struct request_failed {
  int64_t request_id = 0;
  error_code code = error_code::internal;
  std::string message;
};

// One step's deltas, for the detokenizer. timelines[i] is set for finished deltas[i]. A request
// the step ended in error has no final delta: it comes in `failures`, after the deltas, so the
// detokenizer drops its state before it tells the frontend.
struct token_batch {
  std::vector<token_delta> deltas;
  std::vector<request_timeline> timelines;  // [deltas.size()]
  std::vector<request_failed> failures;

  bool empty() const { return deltas.empty() && failures.empty(); }
};

struct text_delta {
  token_delta delta;
  std::string text;
  request_timeline timeline;  // meaningful when delta.finished()
};

struct text_batch {
  std::vector<text_delta> deltas;
};

struct abort_request_msg {
  int64_t request_id = 0;
};

// From the detokenizer: the request's text matched a stop string. The scheduler finishes it and
// frees its blocks; the client still gets exactly one final delta, from the detokenizer.
struct stop_request_msg {
  int64_t request_id = 0;
};

// A failure drill (node::fail_stage): the stage that receives it throws `reason` from its
// handler, exactly as a bug would, so the node's handling of a failed stage can be exercised on a
// live node. Never sent in normal serving.
struct stage_failure_drill {
  std::string reason;
};

struct stats_query {
  uint64_t tag = 0;
};

struct stats_answer {
  uint64_t tag = 0;
  int32_t num_free_blocks = 0;
  int32_t num_total_blocks = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  // Non-empty when the node cannot answer because a stage has failed (the reason, e.g. "the node
  // is out of service: the scheduler stage failed: ..."); the counts are then meaningless.
  std::string unavailable;
};

}  // namespace troupe
