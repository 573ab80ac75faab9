#pragma once
// GET /metrics: the server's counters and the scheduler's gauges in Prometheus' text exposition
// format (version 0.0.4). The troupe: families are named and labelled as vLLM's vllm: ones (with
// model_name on each sample), so dashboards built for vLLM read them; the troupe_ families are
// the server's own.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "doors/serving_metrics.hpp"
#include "stages/messages.hpp"

namespace troupe {

struct metrics_snapshot {
  uint64_t num_requests_zmq = 0;  // admitted, per door
  uint64_t num_requests_http = 0;
  uint64_t num_refused_zmq = 0;  // refused by the shared in-flight bound, per door
  uint64_t num_refused_http = 0;
  int64_t num_requests_in_flight = 0;
  int64_t max_requests_in_flight = 0;
  uint64_t num_prompt_tokens = 0;
  uint64_t num_generation_tokens = 0;
  uint64_t num_finished_stop = 0;
  uint64_t num_finished_length = 0;
  uint64_t num_finished_abort = 0;
  uint64_t num_failed = 0;
  uint64_t num_http_responses_2xx = 0;
  uint64_t num_http_responses_4xx = 0;
  uint64_t num_http_responses_5xx = 0;
  int64_t num_http_streams_open = 0;
  // This process's CPU time since it began serving: all of it, and the model's steps' share
  // (engine/process_cpu.hpp).
  double process_cpu_seconds = 0;
  double compute_cpu_seconds = 0;
  // The scheduler's answer to a stats query; absent when it did not answer in time.
  struct scheduler_gauges {
    int num_free_blocks = 0;
    int num_total_blocks = 0;
    int num_running = 0;
    int num_waiting = 0;
  };
  std::optional<scheduler_gauges> scheduler;
  // From the same answer: early rejections and each instance's step-time model.
  int64_t num_slo_rejections = 0;
  int64_t num_overload_refusals = 0;  // the router's pair admission
  std::vector<step_model_report> step_models;
  // The engine instances' processes (from the same answer) and this one's identity: the others
  // are a disaggregated cluster's nodes, shown beside this process's own CPU.
  std::vector<process_cpu_report> processes;
  std::string own_process;
  std::string model_name;  // the model_name label of the troupe: families
  serving_metrics_snapshot serving;
  // Appended as it is: more families in the same format (e.g. per-stage gauges), each name used
  // once in the whole exposition.
  std::string extra;
};

std::string render_metrics(const metrics_snapshot& m);

// A label value as the text format wants it: backslash, double quote and line feed escaped.
std::string escape_label_value(std::string_view value);
// One histogram's samples (cumulative _bucket lines up to le="+Inf", then _sum and _count) under
// its HELP and TYPE lines; `labels` (rendered, without braces, e.g. `model_name="m"`) go on each.
void render_histogram(std::string& out, std::string_view name, std::string_view help, std::string_view labels,
                      const latency_histogram& h);

}  // namespace troupe
