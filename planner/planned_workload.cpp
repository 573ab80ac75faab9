#include "planner/planned_workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe {

planned_length_distribution parse_planned_length_distribution(const std::string& name) {
  if (name == "fixed") return planned_length_distribution::fixed;
  if (name == "uniform") return planned_length_distribution::uniform;
  if (name == "lognormal") return planned_length_distribution::lognormal;
  throw std::invalid_argument("length distribution '" + name + "' is not one of fixed, uniform, lognormal");
}

namespace {

int draw_length(const planned_length& length, std::mt19937_64& rng) {
  double value = length.mean;
  switch (length.distribution) {
    case planned_length_distribution::fixed: break;
    case planned_length_distribution::uniform: {
      std::uniform_real_distribution<double> pick(length.mean * (1 - length.spread), length.mean * (1 + length.spread));
      value = pick(rng);
      break;
    }
    case planned_length_distribution::lognormal: {
      // mu chosen so the distribution's mean is `mean`: E = exp(mu + sigma^2 / 2).
      const double sigma = length.spread;
      std::lognormal_distribution<double> pick(std::log(std::max(1, length.mean)) - sigma * sigma / 2, sigma);
      value = pick(rng);
      break;
    }
  }
  return std::max(1, static_cast<int>(std::lround(value)));
}

}  // namespace

std::vector<planned_request> draw_workload(const std::vector<request_class>& mix, int count, double rate,
                                           double burstiness, uint64_t seed) {
  if (count <= 0) throw std::invalid_argument("a workload needs at least one request, got " + std::to_string(count));
  if (!(rate > 0)) throw std::invalid_argument("a workload's rate must be positive, got " + std::to_string(rate));
  if (!(burstiness > 0)) {
    throw std::invalid_argument("a workload's burstiness must be positive, got " + std::to_string(burstiness));
  }
  std::vector<double> shares;
  for (const request_class& c : mix) shares.push_back(std::max(0.0, c.share));
  if (shares.empty() || std::all_of(shares.begin(), shares.end(), [](double s) { return s == 0; })) {
    throw std::invalid_argument("a workload needs a request class with a positive share");
  }
  std::mt19937_64 rng(seed);
  std::discrete_distribution<size_t> pick_class(shares.begin(), shares.end());
  // Gamma gaps of mean 1 / rate: shape k = burstiness, scale 1 / (rate k).
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  std::vector<planned_request> requests;
  requests.reserve(static_cast<size_t>(count));
  double now = 0;
  for (int i = 0; i < count; ++i) {
    const request_class& c = mix[pick_class(rng)];
    planned_request r;
    r.arrival_s = now;
    r.prompt_len = draw_length(c.prompt, rng);
    r.output_len = draw_length(c.output, rng);
    requests.push_back(r);
    now += gap(rng);
  }
  return requests;
}

namespace {

nlohmann::json read_bench_run(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the bench run " + path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + " is not JSON: " + e.what());
  }
}

}  // namespace

std::vector<planned_request> load_bench_run(const std::string& path) {
  const nlohmann::json run = read_bench_run(path);
  if (!run.contains("requests") || !run["requests"].is_array() || run["requests"].empty()) {
    throw std::runtime_error(path +
                             " holds no \"requests\" array (write one with tools/bench --json, without --sweep)");
  }
  std::vector<planned_request> requests;
  for (const nlohmann::json& r : run["requests"]) {
    planned_request p;
    try {
      p.arrival_s = r.at("start_s").get<double>();  // tools/bench_tool/run_summary.cpp writes these
      p.prompt_len = r.at("prompt_tokens").get<int>();
      p.output_len = r.at("output_tokens").get<int>();
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(path + ": request " + std::to_string(requests.size()) + ": " + e.what());
    }
    if (p.prompt_len <= 0 || p.output_len <= 0 || !(p.arrival_s >= 0)) {
      throw std::runtime_error(path + ": request " + std::to_string(requests.size()) +
                               " has no prompt or output tokens, or a negative start (did it fail?)");
    }
    requests.push_back(p);
  }
  std::stable_sort(requests.begin(), requests.end(),
                   [](const planned_request& a, const planned_request& b) { return a.arrival_s < b.arrival_s; });
  return requests;
}

double bench_run_client_cpu_per_request(const std::string& path) {
  const nlohmann::json run = read_bench_run(path);
  const nlohmann::json* summary = run.contains("summary") ? &run["summary"] : nullptr;
  if (!summary || !summary->contains("client_cpu_seconds") || !summary->contains("num_requests")) return 0;
  try {
    const double cpu = summary->at("client_cpu_seconds").get<double>();
    const int requests = summary->at("num_requests").get<int>();
    if (!(cpu >= 0) || requests <= 0) throw std::runtime_error("a negative CPU time or no requests");
    return cpu / requests;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": summary's client_cpu_seconds or num_requests: " + e.what());
  }
}

std::vector<planned_request> at_rate(std::vector<planned_request> requests, double from_rate, double to_rate) {
  if (!(from_rate > 0) || !(to_rate > 0)) throw std::invalid_argument("rates must be positive");
  for (planned_request& r : requests) r.arrival_s *= from_rate / to_rate;
  return requests;
}

}  // namespace troupe
