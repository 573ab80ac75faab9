#include "tools/bench_tool/run_summary.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace troupe::bench_tool {

namespace {

double parse_duration(const std::string& name, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("--slo " + name + "=" + text + ": not a number with a unit (e.g. 200ms)");
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit == "ms")
    scale = 1e-3;
  else if (unit == "s")
    scale = 1.0;
  else if (unit == "us")
    scale = 1e-6;
  else
    throw std::invalid_argument("--slo " + name + "=" + text + ": unit '" + unit + "' is not one of us, ms, s");
  if (!(value > 0) || !std::isfinite(value))
    throw std::invalid_argument("--slo " + name + "=" + text + ": must be above 0");
  return value * scale;
}

}  // namespace

bool slo::met_by(const request_record& r) const {
  if (!r.ok) return false;
  if (ttft && r.ttft > *ttft) return false;
  if (tpot && r.output_tokens > 1 && r.tpot() > *tpot) return false;
  if (e2e && r.e2e > *e2e) return false;
  return true;
}

slo parse_slo(const std::string& text) {
  slo targets;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--slo: '" + item + "' is not name=value (e.g. ttft=200ms)");
    const std::string name = item.substr(0, eq);
    const double seconds = parse_duration(name, item.substr(eq + 1));
    if (name == "ttft")
      targets.ttft = seconds;
    else if (name == "tpot")
      targets.tpot = seconds;
    else if (name == "e2e")
      targets.e2e = seconds;
    else
      throw std::invalid_argument("--slo: unknown target '" + name + "' (expected ttft, tpot or e2e)");
  }
  if (targets.empty()) throw std::invalid_argument("--slo: no target given (e.g. ttft=200ms,tpot=50ms)");
  return targets;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

latency_stats summarize(const std::vector<double>& values) {
  latency_stats s;
  s.count = values.size();
  if (values.empty()) return s;
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.min = *std::min_element(values.begin(), values.end());
  s.max = *std::max_element(values.begin(), values.end());
  return s;
}

run_summary summarize_run(const std::vector<request_record>& records, double duration, double offered_rate,
                          int concurrency, const slo& targets) {
  run_summary s;
  s.offered_rate = offered_rate;
  s.concurrency = concurrency;
  s.num_requests = static_cast<int>(records.size());
  s.duration = duration;
  std::vector<double> ttft, tpot, itl, e2e;
  int num_met = 0;
  for (const auto& r : records) {
    if (!r.ok) {
      ++s.num_errors;
      if (s.first_errors.size() < 5) s.first_errors.push_back(r.error);
      continue;
    }
    ++s.num_completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back(r.tpot());
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    if (targets.met_by(r)) ++num_met;
    if (r.speculative) {
      auto& spec = s.speculative ? *s.speculative : s.speculative.emplace();
      ++spec.num_requests;
      spec.draft_tokens += r.draft_tokens;
      spec.accepted_tokens += r.accepted_tokens;
      spec.tokens_per_step += r.tokens_per_step;  // divided below
    }
  }
  if (s.speculative) {
    auto& spec = *s.speculative;
    spec.acceptance_rate = spec.draft_tokens > 0 ? static_cast<double>(spec.accepted_tokens) / spec.draft_tokens : 0.0;
    spec.tokens_per_step /= spec.num_requests;
  }
  if (duration > 0) {
    s.request_throughput = s.num_completed / duration;
    s.input_throughput = static_cast<double>(s.total_input_tokens) / duration;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration;
  }
  s.ttft = summarize(ttft);
  s.tpot = summarize(tpot);
  s.itl = summarize(itl);
  s.e2e = summarize(e2e);
  if (!targets.empty() && !records.empty()) {
    s.slo_attainment = static_cast<double>(num_met) / static_cast<double>(records.size());
    s.goodput = duration > 0 ? num_met / duration : 0.0;
  }
  return s;
}

namespace {

nlohmann::json stats_json(const latency_stats& s) {
  return {{"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p90_ms", s.p90 * 1e3}, {"p99_ms", s.p99 * 1e3},
          {"min_ms", s.min * 1e3},   {"max_ms", s.max * 1e3},       {"count", s.count}};
}

}  // namespace

nlohmann::json to_json(const run_summary& s) {
  nlohmann::json j = {
      {"offered_rate", std::isinf(s.offered_rate) ? nlohmann::json("inf") : nlohmann::json(s.offered_rate)},
      {"concurrency", s.concurrency},
      {"num_requests", s.num_requests},
      {"num_completed", s.num_completed},
      {"num_errors", s.num_errors},
      {"duration_s", s.duration},
      {"total_input_tokens", s.total_input_tokens},
      {"total_output_tokens", s.total_output_tokens},
      {"request_throughput", s.request_throughput},
      {"input_throughput", s.input_throughput},
      {"output_throughput", s.output_throughput},
      {"ttft", stats_json(s.ttft)},
      {"tpot", stats_json(s.tpot)},
      {"itl", stats_json(s.itl)},
      {"e2e", stats_json(s.e2e)},
      {"errors", s.first_errors},
      {"client_cpu_seconds", s.client_cpu_seconds}};
  if (s.slo_attainment) {
    j["slo_attainment"] = *s.slo_attainment;
    j["goodput"] = *s.goodput;
  }
  if (s.speculative) {
    j["speculative"] = {{"num_requests", s.speculative->num_requests},
                        {"draft_tokens", s.speculative->draft_tokens},
                        {"accepted_tokens", s.speculative->accepted_tokens},
                        {"acceptance_rate", s.speculative->acceptance_rate},
                        {"mean_tokens_per_step", s.speculative->tokens_per_step}};
  }
  return j;
}

nlohmann::json to_json(const request_record& r) {
  nlohmann::json j = {{"ok", r.ok},
                      {"prompt_tokens", r.prompt_tokens},
                      {"output_tokens", r.output_tokens},
                      {"start_s", r.start},
                      {"ttft_s", r.ttft},
                      {"tpot_s", r.tpot()},
                      {"e2e_s", r.e2e},
                      {"itl_s", r.itl}};
  if (!r.ok) j["error"] = r.error;
  if (r.speculative) {
    j["draft_tokens"] = r.draft_tokens;
    j["accepted_tokens"] = r.accepted_tokens;
    j["tokens_per_step"] = r.tokens_per_step;
  }
  return j;
}

std::string format_summary(const run_summary& s) {
  std::string out;
  char line[160];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof line, "%-36s %14s\n", name, value.c_str());
    out += line;
  };
  auto num = [](double v, int decimals) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
    return std::string(b);
  };
  out += "============ Serving Benchmark Result ============\n";
  row("Offered rate (req/s):", std::isinf(s.offered_rate) ? "inf" : num(s.offered_rate, 2));
  if (s.concurrency > 0) row("Max concurrency:", std::to_string(s.concurrency));
  row("Successful requests:", std::to_string(s.num_completed));
  row("Failed requests:", std::to_string(s.num_errors));
  row("Benchmark duration (s):", num(s.duration, 2));
  row("Total input tokens:", std::to_string(s.total_input_tokens));
  row("Total generated tokens:", std::to_string(s.total_output_tokens));
  row("Request throughput (req/s):", num(s.request_throughput, 2));
  row("Input token throughput (tok/s):", num(s.input_throughput, 2));
  row("Output token throughput (tok/s):", num(s.output_throughput, 2));
  if (s.slo_attainment) {
    row("SLO attainment (%):", num(*s.slo_attainment * 100, 1));
    row("Goodput (req/s):", num(*s.goodput, 2));
  }
  if (s.speculative) {
    row("Draft acceptance rate (%):", num(s.speculative->acceptance_rate * 100, 1));
    row("Mean tokens per step:", num(s.speculative->tokens_per_step, 2));
  }
  auto block = [&](const char* title, const char* name, const latency_stats& st) {
    char head[80];
    std::snprintf(head, sizeof head, "%s", title);
    out += std::string("---------------") + head + "---------------\n";
    const std::string n(name);
    row(("Mean " + n + " (ms):").c_str(), num(st.mean * 1e3, 2));
    row(("Median " + n + " (ms):").c_str(), num(st.median * 1e3, 2));
    row(("P90 " + n + " (ms):").c_str(), num(st.p90 * 1e3, 2));
    row(("P99 " + n + " (ms):").c_str(), num(st.p99 * 1e3, 2));
  };
  block("Time to First Token", "TTFT", s.ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", s.tpot);
  block("Inter-token Latency", "ITL", s.itl);
  block("End-to-end Latency", "E2E", s.e2e);
  out += "==================================================\n";
  for (const auto& e : s.first_errors) out += "error: " + e + "\n";
  return out;
}

}  // namespace troupe::bench_tool
