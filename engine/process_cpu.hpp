#pragma once
// This process's CPU time, split into the model's compute and the serving stack around it (doors,
// tokenizers, the actors' messages, the detokenizer, ZeroMQ's and HTTP's threads), for /metrics
// and `troupe plan` (issue 29). On a machine whose cores the model shares with its own serving
// stack and with clients, what the stack costs a request bounds the rate as much as a step's time
// does: a stories260K step is 0.3-1 ms, about what the stack spends on the request's messages, so
// a plan that charges only steps served 300 req/s where the server held 200.
//
// Compute is what ran model steps: the CPU of the thread that ran each step, while it ran
// (added by the worker), and every thread named `compute_thread_name` (the CPU backend's pool).
// The stack is the rest.

#include <cstdint>
#include <string>

namespace troupe {

// The name the CPU backend gives its pool threads (at most 15 characters, the kernel's limit).
inline constexpr const char* compute_thread_name = "troupe-compute";

struct process_cpu_time {
  double total_s = 0;    // the whole process, user and system
  double compute_s = 0;  // the model's steps
  double stack_s() const { return total_s > compute_s ? total_s - compute_s : 0.0; }
};

// The calling thread's CPU time so far, in nanoseconds.
int64_t thread_cpu_ns();

// A step's CPU on the thread that ran it (the worker's), counted as compute.
void add_step_cpu_ns(int64_t ns);

// Reads /proc/self/task for the pool threads: call it per scrape, not per step. Zeros for what
// cannot be read.
process_cpu_time current_process_cpu();

// "host:pid": tells this process from the others of a cluster, on one machine or several.
std::string process_identity();

// Marks the moment the server began serving: what the process spent before (loading the model,
// starting its stages) is no request's cost. The first call counts, later ones do nothing, so
// the counters in /metrics never go back (a worker added later by `troupe scale` loads on the
// stack's side of the split).
void mark_serving_began();
// The process's CPU since mark_serving_began (since its start when never marked).
process_cpu_time process_cpu_while_serving();

}  // namespace troupe
