// troupe plan: which topology serves a workload best under an SLO, predicted rather than measured.
// The real router and schedulers run on a simulated clock (planner/cluster_simulation.hpp) with a
// step-time model calibrated on the model itself (--calibrate), read from a serving instance's
// /metrics (--metrics-url), or given (--step-model); each candidate topology (colocated, every
// xPyD split of --workers, each token budget) is run at each rate, and the table and the choice
// are printed; --out writes each topology's rows as a tools/bench sweep.csv (--replot draws them).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include <httplib.h>

#include "cli/command_registry.hpp"
#include "engine/llm_engine.hpp"
#include "engine/served_model.hpp"
#include "planner/plan_sweep.hpp"
#include "planner/served_step_costs.hpp"

#include <filesystem>
#include <fstream>

namespace troupe::cli {
namespace {

struct plan_flags {
  // Where the step-time model comes from: one of these three.
  std::string calibrate_model;
  std::string metrics_url;
  std::string step_model;
  int threads = 0;
  int calibrate_requests = 32;  // batches up to this: decode batches as large as serving meets fit better
  // The instances' limits (from the calibrated model or the scraped server when not given).
  int num_kv_blocks = 0;
  int block_size = 16;
  int max_model_len = 0;
  int max_num_seqs = 256;
  int kv_memory_mb = 512;
  std::string scheduling_policy = "priority";
  std::string slo_admission = "best_effort";
  std::string async_scheduling = "on";  // as serve: the next step planned while one runs
  // The workload.
  std::string bench_run;
  std::vector<std::string> mix;
  int input_len = 256;
  int output_len = 128;
  std::string input_dist = "fixed";
  std::string output_dist = "fixed";
  double input_spread = 0;
  double output_spread = 0;
  int num_prompts = 200;
  double burstiness = 1;
  uint64_t seed = 0;
  // The candidates and the question.
  std::vector<double> rates;
  int workers = 1;
  std::vector<int> budgets;
  double kv_latency_ms = 1;
  double kv_us_per_token = 1;
  std::string slo = "ttft=1s,tpot=100ms";
  double goodput_target = 0.9;
  double horizon_s = 600;
  // One machine's cores shared by the instances, their serving stack and the clients.
  int cores = 0;
  std::string stack_metrics_url;  // default: --metrics-url
  // Not given (NaN): the stack's from the server's /metrics, the clients' from --bench-run.
  double stack_ms_per_request = std::numeric_limits<double>::quiet_NaN();
  double stack_ms_per_token = std::numeric_limits<double>::quiet_NaN();
  double client_ms_per_request = std::numeric_limits<double>::quiet_NaN();
  int stack_threads = 0;  // 0: from /metrics
  std::string out_dir;
};

// "200ms", "1s", "500us" -> seconds.
double parse_duration(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::runtime_error("--slo: " + what + " '" + text + "' is not a duration such as 200ms");
  }
  const std::string unit = text.substr(used);
  if (unit == "ms") return value / 1e3;
  if (unit == "us") return value / 1e6;
  if (unit == "s" || unit.empty()) return value;
  throw std::runtime_error("--slo: " + what + " '" + text + "' has unit '" + unit + "', not us, ms or s");
}

service_level parse_slo(const std::string& text) {
  service_level slo;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto equals = part.find('=');
    if (equals == std::string::npos) throw std::runtime_error("--slo: '" + part + "' is not name=duration");
    const std::string name = part.substr(0, equals);
    const double seconds = parse_duration(part.substr(equals + 1), name);
    if (name == "ttft") {
      slo.ttft_s = seconds;
    } else if (name == "tpot") {
      slo.tpot_s = seconds;
    } else {
      throw std::runtime_error("--slo: '" + name + "' is not ttft or tpot");
    }
  }
  return slo;
}

// "step,token,sequence,context_token,attention_pair[,token_floor[,least_step]]": seconds per
// feature, then the floor in tokens (1 when left out) and the least step's seconds (0).
step_cost parse_step_model(const std::string& text) {
  constexpr const char* takes =
      "--step-model takes 5 numbers (seconds per step, token, sequence, context token, attention pair) and "
      "optionally a 6th, the token floor, and a 7th, the least step's seconds";
  std::vector<double> numbers;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size()) throw std::runtime_error("--step-model: '" + part + "' is not a number");
    numbers.push_back(value);
  }
  if (numbers.size() < step_cost::num_features || numbers.size() > step_cost::num_features + 2) {
    throw std::runtime_error(takes);
  }
  step_cost cost;
  std::copy_n(numbers.begin(), step_cost::num_features, cost.seconds.begin());
  if (numbers.size() > step_cost::num_features) cost.token_floor = numbers[step_cost::num_features];
  if (numbers.size() > step_cost::num_features + 1) cost.min_seconds = numbers[step_cost::num_features + 1];
  if (!(cost.token_floor >= 1)) throw std::runtime_error("--step-model: the token floor must be at least 1");
  if (!(cost.min_seconds >= 0)) throw std::runtime_error("--step-model: the least step must be 0 s or more");
  return cost;
}

// "SHARE:INPUT:OUTPUT", e.g. 0.8:64:32.
request_class parse_mix_class(const std::string& text) {
  request_class c;
  char colon1 = 0, colon2 = 0;
  std::stringstream in(text);
  if (!(in >> c.share >> colon1 >> c.prompt.mean >> colon2 >> c.output.mean) || colon1 != ':' || colon2 != ':' ||
      !in.eof() || c.share <= 0 || c.prompt.mean <= 0 || c.output.mean <= 0) {
    throw std::runtime_error("--mix: '" + text + "' is not SHARE:INPUT_LEN:OUTPUT_LEN with positive numbers");
  }
  return c;
}

struct calibration {
  step_costs_by_role step_times;
  int num_kv_blocks = 0;
  int max_model_len = 0;
  std::optional<served_step_costs> served;  // what --metrics-url read, stack CPU included
};

// Runs the model itself on bursts of prompts of several lengths and batch sizes (plain llm_engine,
// as `troupe generate` does) and takes the step-time model its scheduler fitted. The lengths are
// a spread (16 tokens, a quarter of the longest, the longest) and `workload_lengths`, so the fit
// has seen the steps the plan will meet.
calibration calibrate(const plan_flags& flags, const std::vector<int>& workload_lengths) {
  model_spec spec;
  spec.path = flags.calibrate_model;
  spec.backend.threads = flags.threads;
  spec.block_size = flags.block_size;
  spec.kv_memory_mb = flags.kv_memory_mb;
  spec.max_num_seqs = flags.max_num_seqs;
  if (flags.max_model_len > 0) spec.max_model_len = flags.max_model_len;
  if (flags.num_kv_blocks > 0) spec.num_kv_blocks = flags.num_kv_blocks;
  spec.validate();
  std::shared_ptr<served_model> served = load_served_model(spec);
  engine_config config = served->base_engine_config();
  config.max_num_seqs = flags.max_num_seqs;
  calibration out;
  out.num_kv_blocks = config.num_kv_blocks;
  out.max_model_len = config.max_model_len;
  const int vocab = std::max(8, config.vocab_size);
  llm_engine engine(std::move(served->backend_model), config, std::vector<int32_t>{});
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  const int longest = std::max(16, std::min(1024, config.max_model_len / 2));
  std::vector<int> lengths{16, longest / 4, longest};
  for (int length : workload_lengths) lengths.push_back(std::clamp(length, 1, longest));
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  for (int batch : {1, flags.calibrate_requests / 2, flags.calibrate_requests}) {
    for (int prompt_len : lengths) {
      for (int i = 0; i < std::max(1, batch); ++i) {
        std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
        for (int32_t& id : prompt) id = token(rng);
        sampling_params params;
        params.temperature = 0;
        params.max_tokens = 24;
        params.ignore_eos = true;
        const add_request_result added = engine.add_request(std::move(prompt), params);
        if (!added.ok()) throw std::runtime_error("calibration request refused: " + added.error->message);
      }
      for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) engine.step();
    }
  }
  const step_time_model& fitted = engine.get_scheduler().step_times();
  out.step_times.mixed = fitted.fitted();
  std::fprintf(stderr, "calibrated on %s: %zu steps, fit error %.3f ms (rms)\n", flags.calibrate_model.c_str(),
               fitted.num_observed(), 1e3 * fitted.rms_error());
  return out;
}

served_step_costs fetch_served(const std::string& url) {
  httplib::Client client(url);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  const auto response = client.Get("/metrics");
  if (!response) throw std::runtime_error("--metrics-url: no answer from " + url);
  if (response->status != 200) {
    throw std::runtime_error("--metrics-url: " + url + "/metrics answered HTTP " + std::to_string(response->status));
  }
  try {
    return parse_served_step_costs(response->body);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("--metrics-url: " + url + "/metrics: " + e.what());
  }
}

// Each role's step-time model in a server's /metrics (planner/served_step_costs.hpp), and its
// KV pool.
calibration scrape(const std::string& url) {
  const served_step_costs served = fetch_served(url);
  if (served.empty()) {
    throw std::runtime_error("--metrics-url: " + url +
                             "/metrics shows no step-time model (troupe_step_time_coefficient_seconds): is it Troupe, "
                             "and has it served a step?");
  }
  calibration out;
  out.served = served;
  out.num_kv_blocks = served.num_kv_blocks;
  out.step_times.prefill = served.prefill;
  out.step_times.decode = served.decode;
  if (served.mixed) {
    out.step_times.mixed = *served.mixed;
  } else {
    // A disaggregated server has no instance that does both: colocated rows borrow the prefill
    // instance's fit (its steps are the larger), and say so.
    out.step_times.mixed = served.prefill ? *served.prefill : *served.decode;
    std::fprintf(stderr, "%s/metrics: no mixed instance; colocated rows use the %s instance's step-time model\n",
                 url.c_str(), served.prefill ? "prefill" : "decode");
  }
  return out;
}

// "3.9 ms + 0.251 ms/token (at least 1 tokens) + ...": a step-time model for the table's header.
std::string describe(const step_cost& cost) {
  const auto& c = cost.seconds;
  char text[256];
  std::snprintf(
      text, sizeof text,
      "%.3g s + %.3g s/token (at least %g tokens) + %.3g s/sequence + %.3g s/context token + %.3g s/attention "
      "pair",
      c[0], c[1], cost.token_floor, c[2], c[3], c[4]);
  return text;
}

std::vector<simulated_cluster> candidates(const plan_flags& flags, const engine_config& config,
                                          const calibration& calibrated, const service_level& slo,
                                          const shared_cores& host) {
  std::vector<int> budgets = flags.budgets;
  if (budgets.empty()) budgets.push_back(config.max_num_batched_tokens);
  std::vector<std::pair<int, int>> splits{{0, 0}};  // (prefill, decode); 0,0: colocated
  for (int p = 1; p < flags.workers; ++p) splits.emplace_back(p, flags.workers - p);
  std::vector<simulated_cluster> out;
  for (const auto& [prefill, decode] : splits) {
    for (int budget : budgets) {
      simulated_cluster c;
      c.num_mixed = prefill == 0 ? flags.workers : 0;
      c.num_prefill = prefill;
      c.num_decode = decode;
      c.config = config;
      c.config.max_num_batched_tokens = budget;
      c.step_times = calibrated.step_times;
      c.kv_latency_s = flags.kv_latency_ms / 1e3;
      c.kv_seconds_per_token = flags.kv_us_per_token / 1e6;
      c.targets = slo;
      c.host = host;
      c.validate();
      out.push_back(c);
    }
  }
  return out;
}

// --cores: the serving stack's CPU from the flags or the server's /metrics (each request's arrival
// and each streamed token one message through the stack), the clients' from --bench-run.
shared_cores host_of(const plan_flags& flags, const calibration& calibrated) {
  shared_cores host;
  if (flags.cores <= 0) return host;
  host.cores = flags.cores;
  host.threads_per_instance = flags.threads > 0 ? flags.threads : flags.cores;
  double per_message = 0;
  if (std::isnan(flags.stack_ms_per_request) || std::isnan(flags.stack_ms_per_token)) {
    // The step model's own scrape when it came from --metrics-url: one read of the server.
    std::optional<served_step_costs> served =
        flags.stack_metrics_url.empty() ? calibrated.served : fetch_served(flags.stack_metrics_url);
    if (served) {
      per_message = served->stack_seconds_per_message();
      host.stack_threads = std::max(1, served->num_stack_processes);
    }
  }
  if (flags.stack_threads > 0) host.stack_threads = flags.stack_threads;
  if (!flags.metrics_url.empty()) {
    std::fprintf(stderr,
                 "note: a server's own step fit already holds the contention it was fitted under, and --cores charges "
                 "it again; a --calibrate model (with --stack-metrics-url) plans shared cores better\n");
  }
  auto given_or = [](double ms, double otherwise) { return std::isnan(ms) ? otherwise : ms / 1e3; };
  host.stack_seconds_per_request = given_or(flags.stack_ms_per_request, per_message);
  host.stack_seconds_per_token = given_or(flags.stack_ms_per_token, per_message);
  host.client_seconds_per_request = !std::isnan(flags.client_ms_per_request) ? flags.client_ms_per_request / 1e3
                                    : flags.bench_run.empty()                ? 0.0
                                                              : bench_run_client_cpu_per_request(flags.bench_run);
  std::printf(
      "shared cores: %d (an instance's step keeps %d busy); serving stack %.3g ms a request + %.3g ms a token on %d "
      "threads; clients %.3g ms a request\n",
      host.cores, host.threads_per_instance, host.stack_seconds_per_request * 1e3, host.stack_seconds_per_token * 1e3,
      host.stack_threads, host.client_seconds_per_request * 1e3);
  return host;
}

std::string slug(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  return out;
}

int run(const plan_flags& flags) {
  const int sources = !flags.calibrate_model.empty() + !flags.metrics_url.empty() + !flags.step_model.empty();
  if (sources != 1) {
    throw std::runtime_error(
        "give the step-time model one way: --calibrate MODEL, --metrics-url URL or --step-model A,B,C,D,E");
  }
  if (flags.rates.empty()) throw std::runtime_error("--rates: give at least one request rate");
  if (flags.workers < 1 || flags.workers > 64) throw std::runtime_error("--workers must be in [1, 64]");
  const service_level slo = parse_slo(flags.slo);

  // The workload at each rate: drawn with one seed (the same requests, spaced for the rate), or a
  // recorded bench run rescaled from its own rate.
  std::vector<planned_request> recorded;
  double recorded_rate = 0;
  if (!flags.bench_run.empty()) {
    recorded = load_bench_run(flags.bench_run);
    const double span = recorded.back().arrival_s - recorded.front().arrival_s;
    recorded_rate = span > 0 ? static_cast<double>(recorded.size() - 1) / span : 1;
  }
  std::vector<request_class> mix;
  for (const std::string& m : flags.mix) mix.push_back(parse_mix_class(m));
  if (mix.empty()) {
    request_class only;
    only.prompt = {flags.input_len, parse_planned_length_distribution(flags.input_dist), flags.input_spread};
    only.output = {flags.output_len, parse_planned_length_distribution(flags.output_dist), flags.output_spread};
    mix.push_back(only);
  }
  auto workload_at = [&](double rate) {
    if (!recorded.empty()) return at_rate(recorded, recorded_rate, rate);
    return draw_workload(mix, flags.num_prompts, rate, flags.burstiness, flags.seed);
  };

  calibration calibrated;
  if (!flags.calibrate_model.empty()) {
    // The workload's prompt lengths at their 10th, 50th and 90th percentiles.
    std::vector<int> lengths;
    for (const planned_request& r : workload_at(flags.rates.front())) lengths.push_back(r.prompt_len);
    std::sort(lengths.begin(), lengths.end());
    std::vector<int> percentiles;
    for (double q : {0.1, 0.5, 0.9}) {
      if (!lengths.empty())
        percentiles.push_back(lengths[static_cast<size_t>(q * static_cast<double>(lengths.size() - 1))]);
    }
    calibrated = calibrate(flags, percentiles);
  } else if (!flags.metrics_url.empty()) {
    calibrated = scrape(flags.metrics_url);
  } else {
    calibrated.step_times.mixed = parse_step_model(flags.step_model);
  }
  engine_config config;
  config.block_size = flags.block_size;
  config.num_kv_blocks = flags.num_kv_blocks > 0 ? flags.num_kv_blocks : calibrated.num_kv_blocks;
  if (config.num_kv_blocks <= 0) throw std::runtime_error("--num-kv-blocks: the KV pool's size is not known; give it");
  config.max_model_len = flags.max_model_len > 0        ? flags.max_model_len
                         : calibrated.max_model_len > 0 ? calibrated.max_model_len
                                                        : config.max_model_len;
  config.max_num_seqs = flags.max_num_seqs;
  config.scheduling_policy = parse_scheduling_policy(flags.scheduling_policy);
  config.slo_admission = parse_slo_admission(flags.slo_admission);
  config.async_scheduling = flags.async_scheduling == "on";
  config.kv_window = 0;
  std::printf("step-time model: %s; %d KV blocks of %d\n", describe(calibrated.step_times.mixed).c_str(),
              config.num_kv_blocks, config.block_size);
  // The same model as flags, so another plan can reuse a calibration (each one differs by the
  // machine's minute: up to 15 % on the cost per token here).
  const step_cost& mixed = calibrated.step_times.mixed;
  std::printf("as flags: --step-model %.6g,%.6g,%.6g,%.6g,%.6g,%g,%.6g --num-kv-blocks %d\n", mixed.seconds[0],
              mixed.seconds[1], mixed.seconds[2], mixed.seconds[3], mixed.seconds[4], mixed.token_floor,
              mixed.min_seconds, config.num_kv_blocks);
  if (calibrated.step_times.prefill) {
    std::printf("prefill instances' step-time model: %s\n", describe(*calibrated.step_times.prefill).c_str());
  }
  if (calibrated.step_times.decode) {
    std::printf("decode instances' step-time model: %s\n", describe(*calibrated.step_times.decode).c_str());
  }

  std::vector<plan_row> rows;
  const shared_cores host = host_of(flags, calibrated);
  for (const simulated_cluster& cluster : candidates(flags, config, calibrated, slo, host)) {
    for (double rate : flags.rates) {
      const std::vector<planned_request> workload = workload_at(rate);
      const simulation_result result = simulate(cluster, workload, flags.horizon_s);
      rows.push_back(summarize_simulation(cluster.name(), rate, workload, result, slo));
    }
  }
  const std::vector<plan_choice> ranking = rank_topologies(rows, flags.goodput_target);
  std::printf("%s", format_plan(rows, ranking, flags.goodput_target).c_str());

  if (!flags.out_dir.empty()) {
    for (const plan_choice& choice : ranking) {
      std::vector<plan_row> mine;
      for (const plan_row& r : rows) {
        if (r.topology == choice.topology) mine.push_back(r);
      }
      const std::filesystem::path dir = std::filesystem::path(flags.out_dir) / slug(choice.topology);
      std::filesystem::create_directories(dir);
      std::ofstream(dir / "sweep.csv") << plan_sweep_csv(mine);
      std::printf("wrote %s (plots: tools/bench --replot %s --out %s)\n", (dir / "sweep.csv").c_str(),
                  (dir / "sweep.csv").c_str(), dir.c_str());
    }
  }
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<plan_flags>();
  auto* app = parent.add_subcommand("plan", "predict which topology serves a workload best under an SLO (simulated)");
  app->add_option("--calibrate", f->calibrate_model, "a model to time: run it briefly and fit the step-time model");
  app->add_option("--metrics-url", f->metrics_url, "http://host:port of a serving Troupe: its fitted step-time model");
  app->add_option(
      "--step-model", f->step_model,
      "the step-time model: seconds per step,token,sequence,context_token,attention_pair[,token floor[,least "
      "step]]");
  app->add_option("--threads", f->threads, "--calibrate: CPU threads, as the server will use (0: all)")
      ->capture_default_str();
  app->add_option("--calibrate-requests", f->calibrate_requests, "--calibrate: the largest batch it times")
      ->capture_default_str();
  app->add_option("--num-kv-blocks", f->num_kv_blocks, "each instance's KV pool (default: the calibrated model's)");
  app->add_option("--kv-memory-mb", f->kv_memory_mb, "--calibrate: the KV pool's memory, as serve's flag")
      ->capture_default_str();
  app->add_option("--block-size", f->block_size, "tokens per KV block")->capture_default_str();
  app->add_option("--max-model-len", f->max_model_len, "context length (default: the model's)");
  app->add_option("--max-num-seqs", f->max_num_seqs, "sequences running at once per instance")->capture_default_str();
  app->add_option("--scheduling-policy", f->scheduling_policy, "priority | fcfs | slo | fair")->capture_default_str();
  app->add_option("--slo-admission", f->slo_admission, "best_effort | reject (with the slo policy)")
      ->capture_default_str();
  app->add_option("--async-scheduling", f->async_scheduling,
                  "on | off, as the served instances run (serve's default: on)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app->add_option("--bench-run", f->bench_run,
                  "a tools/bench --json file: simulate its very requests (rescaled per rate)");
  app->add_option("--mix", f->mix,
                  "a request class SHARE:INPUT_LEN:OUTPUT_LEN (repeatable), e.g. 0.8:64:32 0.2:1024:32");
  app->add_option("--input-len", f->input_len, "prompt tokens (without --mix)")->capture_default_str();
  app->add_option("--output-len", f->output_len, "output tokens (without --mix)")->capture_default_str();
  app->add_option("--input-dist", f->input_dist, "fixed | uniform | lognormal")->capture_default_str();
  app->add_option("--output-dist", f->output_dist, "fixed | uniform | lognormal")->capture_default_str();
  app->add_option("--input-spread", f->input_spread, "uniform: +-share of the mean; lognormal: sigma")
      ->capture_default_str();
  app->add_option("--output-spread", f->output_spread, "as --input-spread")->capture_default_str();
  app->add_option("--num-prompts", f->num_prompts, "requests per simulated run")->capture_default_str();
  app->add_option("--burstiness", f->burstiness, "gamma shape of the gaps: 1 Poisson")->capture_default_str();
  app->add_option("--seed", f->seed, "seed of the lengths and arrivals")->capture_default_str();
  app->add_option("--rates", f->rates, "request rates to simulate (req/s)")->delimiter(',')->required();
  app->add_option("--workers", f->workers, "engine instances to place: colocated xN and every xPyD with x + y = N")
      ->capture_default_str();
  app->add_option("--budgets", f->budgets, "token budgets per step to try (max_num_batched_tokens)")->delimiter(',');
  app->add_option("--kv-latency-ms", f->kv_latency_ms, "xPyD: a KV transfer's fixed cost after its prefill")
      ->capture_default_str();
  app->add_option("--kv-us-per-token", f->kv_us_per_token, "xPyD: and its cost per prompt token")
      ->capture_default_str();
  app->add_option("--slo", f->slo, "targets, e.g. ttft=200ms,tpot=50ms")->capture_default_str();
  app->add_option("--goodput-target", f->goodput_target, "share of requests that must meet the SLO")
      ->capture_default_str();
  app->add_option("--cores", f->cores,
                  "the cores the instances share with their serving stack and clients, on one machine (0: each "
                  "instance on cores of its own, the stack free)")
      ->capture_default_str();
  app->add_option("--stack-metrics-url", f->stack_metrics_url,
                  "--cores: a serving Troupe whose /metrics give the serving stack's CPU (default: --metrics-url)");
  app->add_option("--stack-ms-per-request", f->stack_ms_per_request,
                  "--cores: the stack's CPU for a request's arrival (default: from /metrics)");
  app->add_option("--stack-ms-per-token", f->stack_ms_per_token,
                  "--cores: the stack's CPU for each streamed token (default: from /metrics)");
  app->add_option("--stack-threads", f->stack_threads,
                  "--cores: the stack's work in progress at once (default: the processes /metrics shows, else 1)");
  app->add_option("--client-ms-per-request", f->client_ms_per_request,
                  "--cores: the clients' CPU per request on the same cores (default: --bench-run's own)");
  app->add_option("--horizon", f->horizon_s, "simulated seconds after the last arrival before the rest count as missed")
      ->capture_default_str();
  app->add_option("--out", f->out_dir, "write each topology's rows as a tools/bench sweep.csv here");
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
