#pragma once
// A cluster of engine instances on a simulated clock: the real router (stages/engine_router) and
// the real schedulers (engine/scheduler, with their scheduling policy) decide everything they
// decide when serving; only the model's compute is replaced, by the step-time model's prediction
// of each planned step (engine/step_time_model.hpp), and the KV transfer of a disaggregated
// request by a latency plus a cost per prompt token. So a prediction follows the code that
// serves: chunked prefill under the token budget, preemption, prefix-free admission order, the
// slo policy's prefill cap and early rejection, the router's load balancing and its xPyD split.
//
// On one machine (`simulated_cluster::host`) the instances share their cores with the serving
// stack and the clients, as every server of this project's benches does: the stack is one more
// thread that serves its messages in order (a request's arrival: door, tokenizer, router; each
// streamed token: scheduler, router, detokenizer, door), a client load takes its share, and when
// more want to run than there are cores each runs at cores / wanted of its speed (processor
// sharing). A disaggregated cluster's processes each run a stack: `stack_threads` of its jobs
// progress at once, retiring in order. On stories260K a step is 0.3-1 ms and the stack's work per request as large, so
// a plan that charged only steps served 300 req/s where the server held 200.
//
// Time moves from event to event (an arrival, a step's end, a KV transfer's end); an idle
// instance with work plans its next step at once, as the scheduler actor does. With async
// scheduling (`config.async_scheduling`, serving's default) step N+1 is planned when N starts, as
// the scheduler stage does, so a request arriving while a step runs waits for the one after the
// next: leaving that out put every predicted TTFT about one decode step short. Plain class,
// single-threaded, deterministic.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_config.hpp"
#include "engine/step_time_model.hpp"
#include "planner/planned_workload.hpp"
#include "stages/engine_role.hpp"

namespace troupe {

// What a request must meet to count toward goodput; 0: no target.
struct service_level {
  double ttft_s = 0;
  double tpot_s = 0;
};

// What a step costs on each role's instances: mixed instances' model, and a prefill-only or
// decode-only instance's when it was measured apart (the fits of a disaggregated server's
// instances); a role without its own uses the mixed one.
struct step_costs_by_role {
  step_cost mixed = step_time_model::default_prior;
  std::optional<step_cost> prefill;
  std::optional<step_cost> decode;

  const step_cost& of(engine_role role) const;
};

// The cores instances share with their serving stack and clients; cores 0: not shared (each
// instance computes on cores of its own, and the stack costs nothing).
struct shared_cores {
  int cores = 0;
  int threads_per_instance = 1;           // what a step keeps busy (serve's --threads)
  int stack_threads = 1;                  // the stack's work in progress at once (a cluster's processes)
  double stack_seconds_per_request = 0;   // CPU of a request's arrival through the stack
  double stack_seconds_per_token = 0;     // and of each token it streams
  double client_seconds_per_request = 0;  // the clients' CPU per request on the same cores

  bool shared() const { return cores > 0; }
};

struct simulated_cluster {
  int num_mixed = 1;    // instances that prefill and decode (colocated)
  int num_prefill = 0;  // xPyD: prefill-only and decode-only instances
  int num_decode = 0;
  engine_config config;             // every instance's: KV pool, token budget, policy
  step_costs_by_role step_times;    // what each planned step takes
  double kv_latency_s = 0;          // a disaggregated request's KV: fixed cost after its prefill
  double kv_seconds_per_token = 0;  // and per prompt token
  // The targets the requests carry (the slo policy orders and rejects by them).
  service_level targets;
  shared_cores host;

  // "colocated x1" or "1P1D", with the token budget: for tables.
  std::string name() const;
  // Throws std::invalid_argument naming the first impossible setting.
  void validate() const;
};

struct simulated_outcome {
  double arrival_s = 0;
  double first_token_s = -1;  // -1: none came
  double finish_s = -1;       // -1: never finished
  double last_token_s = -1;
  int output_tokens = 0;
  std::vector<double> token_gaps_s;  // between streamed tokens after the first (a delta's tokens share its gap)
  std::string error;                 // why it failed (refused, not finished within the horizon); empty when served

  bool ok() const { return error.empty() && finish_s >= 0; }
  double ttft() const { return first_token_s - arrival_s; }
  double tpot() const { return output_tokens > 1 ? (finish_s - first_token_s) / (output_tokens - 1) : 0.0; }
  bool meets(const service_level& slo) const {
    return ok() && (slo.ttft_s <= 0 || ttft() <= slo.ttft_s) && (slo.tpot_s <= 0 || tpot() <= slo.tpot_s);
  }
};

struct simulation_result {
  std::vector<simulated_outcome> requests;  // in the workload's order
  int64_t num_steps = 0;
  double end_s = 0;  // when the last request ended

  // Share of all requests (failed ones miss) that meet `slo`; 0 with none.
  double attainment(const service_level& slo) const;
};

// Runs `workload` on `cluster`. Requests still unfinished `horizon_s` after the last arrival fail
// as such (a cluster far past its capacity), so the run is bounded in simulated time and steps.
simulation_result simulate(const simulated_cluster& cluster, const std::vector<planned_request>& workload,
                           double horizon_s = 600);

}  // namespace troupe
