#pragma once
// The step-time models a serving Troupe shows in /metrics (`troupe_step_time_coefficient_seconds`
// and `troupe_step_time_token_floor`, labelled by instance and role), one per role: the first
// instance of each role that shows every coefficient. A disaggregated server's prefill instance
// has only timed prompts and its decode instance only decodes, so each role's steps are planned
// with its own fit: either alone extrapolates to the other's steps (a plan of 1P1D from its
// prefill instance's fit alone put a decode step at 13 ms a sequence and predicted 0 %). Beside
// them, the serving stack's CPU per request (engine/process_cpu.hpp) for plans on shared cores.
// What `troupe plan --metrics-url` plans with. Plain functions over the exposition text.

#include <cstdint>
#include <optional>
#include <string>

#include "engine/step_time_model.hpp"

namespace troupe {

struct served_step_costs {
  std::optional<step_cost> mixed;
  std::optional<step_cost> prefill;
  std::optional<step_cost> decode;
  int num_kv_blocks = 0;  // troupe_kv_blocks_total; 0 when the text has none
  // The serving stack's CPU (troupe_stack_cpu_seconds_total, and a disaggregated cluster's nodes'
  // troupe_node_stack_cpu_seconds_total) and the messages it carried: the requests finished
  // (every reason) and the tokens they streamed.
  double stack_cpu_seconds = 0;
  int num_stack_processes = 0;  // the processes whose stacks it sums
  int64_t num_requests_finished = 0;
  int64_t num_generation_tokens = 0;

  bool empty() const { return !mixed && !prefill && !decode; }
  // The stack's CPU per message through it, counting a request's arrival and each token it
  // streamed as one message each (its tokenizing and routing; its deltas through the
  // scheduler, router, detokenizer and door); 0 before any request finished.
  double stack_seconds_per_message() const;
};

// Lines it does not know are skipped; a number that does not parse throws std::invalid_argument
// naming the line.
served_step_costs parse_served_step_costs(const std::string& metrics_text);

}  // namespace troupe
