#include "doors/http/metrics_text.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "engine/step_time_model.hpp"

namespace troupe {

namespace {

// One metric family in the Prometheus text format: its HELP and TYPE lines, then its samples,
// each named after the family so a sample can never land under another family's header.
class family {
 public:
  family(std::string& out, const char* name, const char* type, const char* help) : out_(out), name_(name) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }

  template <class T>
  family& sample(T value, const char* labels = "") {
    out_ += fmt::format("{}{} {}\n", name_, labels, value);
    return *this;
  }

 private:
  std::string& out_;
  const char* name_;
};

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void render_histogram(std::string& out, std::string_view name, std::string_view help, std::string_view labels,
                      const latency_histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  const auto& counts = h.bucket_counts();
  for (size_t i = 0; i < h.upper_bounds().size(); ++i) {
    cumulative += counts[i];
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, h.upper_bounds()[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, h.count());
  const std::string braces = labels.empty() ? "" : fmt::format("{{{}}}", labels);
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, braces, h.sum(), name, braces, h.count());
}

namespace {

// The troupe: families, after vLLM's vllm: ones.
void render_serving(std::string& out, const metrics_snapshot& m) {
  const std::string model = fmt::format("model_name=\"{}\"", escape_label_value(m.model_name));
  const std::string labels = "{" + model + "}";
  const serving_metrics_snapshot& s = m.serving;
  render_histogram(out, "troupe:time_to_first_token_seconds", "Histogram of time to first token in seconds.", model,
                   s.time_to_first_token);
  render_histogram(out, "troupe:time_per_output_token_seconds",
                   "Histogram of time per output token in seconds (a request's mean after its first).", model,
                   s.time_per_output_token);
  render_histogram(out, "troupe:inter_token_latency_seconds",
                   "Histogram of the time between a request's successive streamed deltas in seconds.", model,
                   s.inter_token_latency);
  render_histogram(out, "troupe:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                   model, s.e2e_request_latency);
  render_histogram(out, "troupe:request_queue_time_seconds",
                   "Histogram of time spent waiting for the first schedule in seconds.", model, s.request_queue_time);
  family(out, "troupe:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
      .sample(s.num_prompt_tokens, labels.c_str());
  family(out, "troupe:generation_tokens_total", "counter", "Number of generation tokens processed.")
      .sample(s.num_generation_tokens, labels.c_str());
  const std::string stop = "{" + model + ",finished_reason=\"stop\"}";
  const std::string length = "{" + model + ",finished_reason=\"length\"}";
  const std::string abort = "{" + model + ",finished_reason=\"abort\"}";
  family(out, "troupe:request_success_total", "counter", "Count of successfully processed requests.")
      .sample(s.num_finished_stop, stop.c_str())
      .sample(s.num_finished_length, length.c_str())
      .sample(s.num_finished_abort, abort.c_str());
  family(out, "troupe:num_preemptions_total", "counter", "Cumulative number of preemptions of finished requests.")
      .sample(s.num_preemptions, labels.c_str());
  if (m.scheduler) {
    const auto& g = *m.scheduler;
    family(out, "troupe:num_requests_running", "gauge", "Number of requests in model execution batches.")
        .sample(g.num_running, labels.c_str());
    family(out, "troupe:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
        .sample(g.num_waiting, labels.c_str());
    const double usage =
        g.num_total_blocks > 0 ? static_cast<double>(g.num_total_blocks - g.num_free_blocks) / g.num_total_blocks : 0.0;
    family(out, "troupe:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
        .sample(usage, labels.c_str());
  }
}

// Speculative decoding (docs/http_api.md, "/metrics"), over finished requests like the token
// counters beside it.
void render_speculative(std::string& out, const serving_metrics_snapshot& s) {
  const speculative_tally& t = s.speculative;
  family(out, "troupe_spec_draft_tokens_total", "counter",
         "Draft tokens proposed and verified by speculative decoding, for finished requests.")
      .sample(t.num_draft_tokens);
  family(out, "troupe_spec_accepted_tokens_total", "counter",
         "Draft tokens the target model accepted (kept as outputs), for finished requests.")
      .sample(t.num_accepted_tokens);
  family(out, "troupe_spec_sampling_steps_total", "counter",
         "Engine steps that sampled a finished request, summed over requests (a step sampling 8 requests counts 8), "
         "with or without drafts: generated tokens over this are the tokens per step, 1 without speculation.")
      .sample(t.num_sampling_steps);
  family(out, "troupe_spec_acceptance_rate", "gauge",
         "Accepted over drafted tokens since the server started (0 before any draft).")
      .sample(t.acceptance_rate());
  render_histogram(out, "troupe_spec_tokens_per_step",
                   "Histogram of output tokens per sampling step of each finished request that had drafts verified.",
                   "", s.tokens_per_step);
}

// The other processes that hold engine instances (a disaggregated cluster's nodes), each once.
void render_node_cpu(std::string& out, const metrics_snapshot& m) {
  std::vector<const process_cpu_report*> nodes;
  for (const process_cpu_report& p : m.processes) {
    if (p.process != m.own_process) nodes.push_back(&p);
  }
  if (nodes.empty()) return;
  auto label = [](const process_cpu_report& p) {
    return fmt::format("{{process=\"{}\"}}", escape_label_value(p.process));
  };
  family compute(out, "troupe_node_compute_cpu_seconds_total", "counter",
                 "CPU time of another process's model steps since it began serving, per process holding engine "
                 "instances.");
  for (const process_cpu_report* p : nodes) compute.sample(p->compute_s, label(*p).c_str());
  family stack(out, "troupe_node_stack_cpu_seconds_total", "counter",
               "CPU time of another process's serving stack (all but its model steps) since it began serving, per "
               "process holding engine instances.");
  for (const process_cpu_report* p : nodes) stack.sample(std::max(0.0, p->total_s - p->compute_s), label(*p).c_str());
}

}  // namespace

std::string render_metrics(const metrics_snapshot& m) {
  std::string out;
  render_serving(out, m);
  family(out, "troupe_requests_total", "counter", "Generation requests admitted, by the door they came through.")
      .sample(m.num_requests_zmq, "{door=\"zmq\"}")
      .sample(m.num_requests_http, "{door=\"http\"}");
  family(out, "troupe_requests_refused_total", "counter",
         "Generation requests refused because the server held its maximum in flight.")
      .sample(m.num_refused_zmq, "{door=\"zmq\"}")
      .sample(m.num_refused_http, "{door=\"http\"}");
  family(out, "troupe_requests_in_flight", "gauge", "Generation requests held in any stage, both doors.")
      .sample(m.num_requests_in_flight);
  family(out, "troupe_requests_in_flight_max", "gauge", "The bound on requests in flight, shared by both doors.")
      .sample(m.max_requests_in_flight);
  family(out, "troupe_requests_finished_total", "counter", "Generation requests finished, by reason.")
      .sample(m.num_finished_stop, "{reason=\"stop\"}")
      .sample(m.num_finished_length, "{reason=\"length\"}")
      .sample(m.num_finished_abort, "{reason=\"abort\"}");
  family(out, "troupe_requests_failed_total", "counter", "Generation requests that ended in an error from a stage.")
      .sample(m.num_failed);
  family(out, "troupe_prompt_tokens_total", "counter", "Prompt tokens of finished requests.")
      .sample(m.num_prompt_tokens);
  family(out, "troupe_generation_tokens_total", "counter", "Tokens generated by finished requests.")
      .sample(m.num_generation_tokens);
  render_speculative(out, m.serving);
  family(out, "troupe_http_responses_total", "counter", "HTTP responses, by status class.")
      .sample(m.num_http_responses_2xx, "{code=\"2xx\"}")
      .sample(m.num_http_responses_4xx, "{code=\"4xx\"}")
      .sample(m.num_http_responses_5xx, "{code=\"5xx\"}");
  family(out, "troupe_http_streams_open", "gauge", "Server-sent event streams being written.")
      .sample(m.num_http_streams_open);
  family(out, "troupe_process_cpu_seconds_total", "counter",
         "CPU time of this process since it began serving (loading left out), user and system.")
      .sample(m.process_cpu_seconds);
  family(out, "troupe_compute_cpu_seconds_total", "counter",
         "CPU time of this process's model steps since it began serving (the threads that ran them, while they did).")
      .sample(m.compute_cpu_seconds);
  family(out, "troupe_stack_cpu_seconds_total", "counter",
         "CPU time of this process's serving stack since it began serving: all of it but the model steps' "
         "(doors, tokenizers, actors, detokenizer).")
      .sample(std::max(0.0, m.process_cpu_seconds - m.compute_cpu_seconds));
  render_node_cpu(out, m);
  if (m.scheduler) {
    const auto& s = *m.scheduler;
    family(out, "troupe_kv_blocks_free", "gauge", "KV cache blocks free (cached prefixes count as free).")
        .sample(s.num_free_blocks);
    family(out, "troupe_kv_blocks_total", "gauge", "KV cache blocks in the pool.").sample(s.num_total_blocks);
    family(out, "troupe_sequences_running", "gauge", "Sequences holding KV blocks and being stepped.")
        .sample(s.num_running);
    family(out, "troupe_sequences_waiting", "gauge", "Sequences queued for admission (including preempted ones).")
        .sample(s.num_waiting);
  }
  if (m.scheduler) {
    family(out, "troupe_requests_rejected_total", "counter",
           "Requests refused at once, by reason: ttft_unattainable (the slo policy: their TTFT target could not be "
           "met), decode_behind (pair admission: every decode instance was behind).")
        .sample(m.num_slo_rejections, "{reason=\"ttft_unattainable\"}")
        .sample(m.num_overload_refusals, "{reason=\"decode_behind\"}");
    if (!m.step_models.empty()) {
      // Each family's samples right under its own header.
      family coefficients(out, "troupe_step_time_coefficient_seconds", "gauge",
                          "The step-time model's seconds per feature, fitted online per instance.");
      for (const step_model_report& r : m.step_models) {
        for (size_t j = 0; j < r.coefficients.size() && j < step_cost::num_features; ++j) {
          coefficients.sample(r.coefficients[j], fmt::format("{{instance=\"{}\",role=\"{}\",feature=\"{}\"}}",
                                                             r.instance, r.role, step_cost::feature_name(j))
                                                     .c_str());
        }
      }
      family floor(out, "troupe_step_time_token_floor", "gauge",
                   "The step-time model's token floor: a step costs at least this many new tokens' matmuls.");
      for (const step_model_report& r : m.step_models)
        floor.sample(r.token_floor, fmt::format("{{instance=\"{}\",role=\"{}\"}}", r.instance, r.role).c_str());
      family fastest(out, "troupe_step_time_min_step_seconds", "gauge",
                     "The step-time model's least prediction: the fastest step it holds.");
      for (const step_model_report& r : m.step_models)
        fastest.sample(r.min_step_s, fmt::format("{{instance=\"{}\",role=\"{}\"}}", r.instance, r.role).c_str());
      family rms(out, "troupe_step_time_fit_rms_seconds", "gauge",
                 "Root mean square of measured minus predicted step time over the steps the fit holds.");
      for (const step_model_report& r : m.step_models)
        rms.sample(r.rms_error_s, fmt::format("{{instance=\"{}\"}}", r.instance).c_str());
      family steps(out, "troupe_step_time_steps_observed_total", "counter", "Steps the step-time model has measured.");
      for (const step_model_report& r : m.step_models)
        steps.sample(r.num_steps, fmt::format("{{instance=\"{}\"}}", r.instance).c_str());
    }
  }
  out += m.extra;
  return out;
}

}  // namespace troupe
