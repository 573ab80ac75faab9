#pragma once
// The figures of one run, as the field reports them (vLLM's benchmark_serving, SGLang's
// bench_serving): TTFT, TPOT, ITL and E2E (mean, median, p90, p99), request and token
// throughput, errors, and SLO attainment when an SLO is given.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_tool/request_record.hpp"

namespace troupe::bench_tool {

// Latency targets a request must meet to count toward goodput; unset targets always hold.
struct slo {
  std::optional<double> ttft;  // seconds
  std::optional<double> tpot;
  std::optional<double> e2e;
  bool empty() const { return !ttft && !tpot && !e2e; }
  bool met_by(const request_record& r) const;
};

// "ttft=200ms,tpot=50ms" (units: us, ms, s); names ttft, tpot, e2e.
slo parse_slo(const std::string& text);

struct latency_stats {
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  size_t count = 0;
};

// Percentiles by linear interpolation between order statistics (numpy's default).
double percentile(std::vector<double> values, double p);
latency_stats summarize(const std::vector<double>& values);

struct run_summary {
  double offered_rate = 0;  // requests/s asked for (inf: all at once)
  int concurrency = 0;      // 0: no bound
  int num_requests = 0;
  int num_completed = 0;
  int num_errors = 0;
  double duration = 0;  // the run's start -> its last reply
  long long total_input_tokens = 0;
  long long total_output_tokens = 0;
  double request_throughput = 0;  // completed requests/s
  double input_throughput = 0;    // prompt tokens/s
  double output_throughput = 0;   // output tokens/s
  latency_stats ttft, tpot, itl, e2e;
  std::optional<double> slo_attainment;   // share of all requests (failed ones miss) meeting the SLO
  std::optional<double> goodput;          // requests/s meeting the SLO
  std::vector<std::string> first_errors;  // up to 5, for the report
  // Speculative decoding, when the server reported it for some completed request.
  struct speculation {
    int num_requests = 0;  // completed requests with usage.speculative
    long long draft_tokens = 0;
    long long accepted_tokens = 0;
    double acceptance_rate = 0;  // accepted / drafts over the run
    double tokens_per_step = 0;  // the mean of those requests' own figures
  };
  std::optional<speculation> speculative;
  // This bench process's own CPU over the run (user and system): on a machine it shares with the
  // server, `troupe plan` charges it to the shared cores (--bench-run).
  double client_cpu_seconds = 0;
};

run_summary summarize_run(const std::vector<request_record>& records, double duration, double offered_rate,
                          int concurrency, const slo& targets);

nlohmann::json to_json(const run_summary& s);
nlohmann::json to_json(const request_record& r);
// A human-readable table, in the layout of vLLM's benchmark_serving.
std::string format_summary(const run_summary& s);

}  // namespace troupe::bench_tool
