// troupe-bench: drives a running server as users do and measures it the way the field does
// (vLLM's benchmark_serving, SGLang's bench_serving): TTFT, TPOT, ITL, E2E, throughput, and
// goodput under an SLO. It speaks Troupe's ZeroMQ protocol and OpenAI's HTTP API, so the same run
// measures other servers. README, "Benchmarking a server", has the commands.

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tools/bench_tool/fake_server.hpp"
#include "tools/bench_tool/goodput_search.hpp"
#include "tools/bench_tool/load_runner.hpp"
#include "tools/bench_tool/run_summary.hpp"
#include "tools/bench_tool/server_client.hpp"
#include "tools/bench_tool/server_process.hpp"
#include "tools/bench_tool/sweep.hpp"
#include "tools/bench_tool/workload.hpp"

namespace {

using namespace troupe::bench_tool;

std::atomic<bool> stop_requested{false};
// The fake server stops in its own time (it checks the flag); the bench stops at once, taking a
// server it started with it (that server leads its own process group, so the terminal's Ctrl-C
// does not reach it).
void on_fake_server_signal(int) { stop_requested = true; }
void on_bench_signal(int signal) {
  signal_running_server();
  _exit(128 + signal);
}

struct options {
  std::string backend = "troupe-zmq";
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string base_url = "http://127.0.0.1:8000";
  bool chat = false;
  std::string model;
  std::string api_key;
  std::string dataset = "random";
  std::string dataset_path;
  int input_len = 128;
  std::optional<int> output_len;
  std::string input_dist = "fixed", output_dist = "fixed";
  double input_spread = 0.25, output_spread = 0.25;
  int shared_prefix_len = 0;
  int num_prefix_groups = 1;
  int vocab_size = 256;
  std::string tokenizer_dir;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int concurrency = 0;
  int num_prompts = 100;
  uint64_t seed = 0;
  double temperature = 0.0;
  bool no_ignore_eos = false;
  int num_speculative_tokens = -1;
  int timeout_s = 600;
  std::string json_path;
  bool progress = false;
  std::string slo_text;
  bool find_goodput = false;
  double goodput_start_rate = 1.0;
  int goodput_max_runs = 12;
  double goodput_target = 0.9;
  double goodput_tolerance = 0.02;
  std::string sweep_text;
  int sweep_rounds = 1;
  int warmup = 0;
  std::string server_cmd;
  int server_timeout_s = 300;
  std::string out_dir = "bench-out";
  std::string replot_csv;
  // The fake server.
  bool fake_server = false;
  fake_server_settings fake;
};

double parse_rate(const std::string& text) {
  if (text == "inf") return INFINITY;
  size_t used = 0;
  double rate = 0;
  try {
    rate = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(rate > 0))
    throw std::invalid_argument("--request-rate '" + text + "' is not a rate above 0 or inf");
  return rate;
}

std::unique_ptr<server_client> make_client(const options& o) {
  request_settings settings;
  settings.temperature = o.temperature;
  settings.ignore_eos = !o.no_ignore_eos;
  settings.num_speculative_tokens = o.num_speculative_tokens;
  settings.timeout = std::chrono::seconds(o.timeout_s);
  if (o.backend == "troupe-zmq") {
    if (o.chat) throw std::invalid_argument("--chat is for --backend openai");
    return make_zmq_client(o.endpoint, o.api_key, settings);
  }
  return make_openai_client(o.base_url, o.api_key, o.model, o.chat, settings);
}

std::vector<bench_request> make_requests(const options& o, prompt_form form, const troupe::tokenizer* tokenizer) {
  if (o.num_prompts < 1) throw std::invalid_argument("--num-prompts must be at least 1");
  if (o.dataset == "sharegpt") {
    if (o.dataset_path.empty()) throw std::invalid_argument("--dataset sharegpt needs --dataset-path");
    // Without a tokenizer, ShareGPT prompts go as text over either door.
    const prompt_form f = tokenizer ? form : prompt_form::text;
    return load_sharegpt_requests(o.dataset_path, o.num_prompts, o.output_len, f, tokenizer, o.seed);
  }
  random_workload w;
  w.input = {o.input_len, parse_length_distribution(o.input_dist), o.input_spread};
  w.output = {o.output_len.value_or(128), parse_length_distribution(o.output_dist), o.output_spread};
  w.shared_prefix_len = o.shared_prefix_len;
  w.num_prefix_groups = o.num_prefix_groups;
  w.vocab_size = tokenizer ? tokenizer->vocab_size() : o.vocab_size;
  return make_random_requests(w, o.num_prompts, form, tokenizer, o.seed);
}

nlohmann::json settings_json(const options& o) {
  return {{"backend", o.backend},
          {"endpoint", o.backend == "troupe-zmq" ? o.endpoint : o.base_url},
          {"chat", o.chat},
          {"dataset", o.dataset},
          {"num_prompts", o.num_prompts},
          {"input_len", o.input_len},
          {"output_len", o.output_len ? nlohmann::json(*o.output_len) : nlohmann::json(nullptr)},
          {"request_rate", o.request_rate},
          {"burstiness", o.burstiness},
          {"concurrency", o.concurrency},
          {"seed", o.seed},
          {"slo", o.slo_text}};
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream out(path);
  if (!(out << j.dump(2) << '\n')) throw std::runtime_error("cannot write --json " + path);
}

// This process's CPU time so far, user and system.
double own_cpu_seconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// One load at `rate`, summarized.
struct bench_context {
  const options& o;
  server_client& client;
  const std::vector<bench_request>& requests;
  slo targets;
  bool progress;

  std::pair<run_summary, load_result> run(double rate) const {
    load_settings s;
    s.rate = rate;
    s.burstiness = o.burstiness;
    s.concurrency = o.concurrency;
    s.seed = o.seed;
    s.progress = progress;
    const double cpu_before = own_cpu_seconds();
    load_result result = run_load(client, requests, s);
    run_summary summary = summarize_run(result.records, result.duration, rate, o.concurrency, targets);
    summary.client_cpu_seconds = own_cpu_seconds() - cpu_before;
    return {std::move(summary), std::move(result)};
  }

  // Requests whose figures are thrown away, so that a freshly started server's first requests
  // (threads starting, pages faulted in) do not count.
  void warm_up() const {
    if (o.warmup <= 0) return;
    const std::vector<bench_request> first(requests.begin(),
                                           requests.begin() + std::min<size_t>(o.warmup, requests.size()));
    load_settings s;
    s.rate = INFINITY;
    s.concurrency = o.concurrency;
    run_load(client, first, s);
  }

  // Searches the rate; prints each probe.
  goodput_result search() const {
    goodput_search_settings gs;
    gs.start_rate = o.goodput_start_rate;
    gs.max_runs = o.goodput_max_runs;
    gs.target = o.goodput_target;
    gs.tolerance = o.goodput_tolerance;
    return find_goodput(
        [&](double rate) {
          const auto [summary, result] = run(rate);
          std::fprintf(stderr, "goodput search: rate %.3f req/s -> SLO attainment %.1f %% (%d failed)\n", rate,
                       summary.slo_attainment.value_or(0) * 100, summary.num_errors);
          return summary.slo_attainment.value_or(0);
        },
        gs);
  }
};

nlohmann::json goodput_json(const goodput_result& g) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : g.probes) probes.push_back({{"rate", p.rate}, {"slo_attainment", p.attainment}, {"met", p.met}});
  return {{"goodput_rate", g.rate ? nlohmann::json(*g.rate) : nlohmann::json(nullptr)},
          {"bracketed", g.bracketed},
          {"probes", probes}};
}

void print_goodput(const goodput_result& g, double target) {
  if (!g.rate) {
    std::printf("Goodput: no rate tried met the SLO for %.0f %% of requests\n", target * 100);
  } else {
    std::printf("Goodput (req/s at >= %.0f %% SLO attainment): %.3f%s (%zu runs)\n", target * 100, *g.rate,
                g.bracketed ? "" : " (a lower bound: no rate tried missed the target)", g.probes.size());
  }
}

// Starts the server command (with {} replaced) and waits until it answers.
std::unique_ptr<server_process> start_server(const options& o, server_client& client, const std::string& value,
                                             const std::string& log_name) {
  std::filesystem::create_directories(o.out_dir);
  const std::string command = substitute(o.server_cmd, value);
  const std::string log = (std::filesystem::path(o.out_dir) / log_name).string();
  std::fprintf(stderr, "starting the server: %s (log: %s)\n", command.c_str(), log.c_str());
  auto server = std::make_unique<server_process>(command, log);
  if (!server->wait_until_ready([&] { return client.answers(); }, std::chrono::seconds(o.server_timeout_s))) {
    throw std::runtime_error("the server command did not answer within " + std::to_string(o.server_timeout_s) +
                             " s (or exited): " + command + "; see " + log);
  }
  return server;
}

int run_bench(const options& o) {
  if (o.backend != "troupe-zmq" && o.backend != "openai") {
    throw std::invalid_argument("--backend '" + o.backend + "' is not troupe-zmq or openai");
  }
  if (o.dataset != "random" && o.dataset != "sharegpt")
    throw std::invalid_argument("--dataset '" + o.dataset + "' is not random or sharegpt");
  const double rate = parse_rate(o.request_rate);
  slo targets;
  if (!o.slo_text.empty()) targets = parse_slo(o.slo_text);
  if (o.find_goodput && targets.empty())
    throw std::invalid_argument("--find-goodput needs --slo (e.g. ttft=200ms,tpot=50ms)");
  std::optional<sweep_spec> sweep;
  if (!o.sweep_text.empty()) sweep = parse_sweep(o.sweep_text);
  if (sweep && sweep->is_rate() && o.find_goodput)
    throw std::invalid_argument("--find-goodput searches the rate itself; it cannot go with --sweep rate=...");
  const bool server_sweep = sweep && !sweep->is_rate();
  if (server_sweep && o.server_cmd.find("{}") == std::string::npos) {
    throw std::invalid_argument(
        "--sweep " + sweep->key +
        "=... restarts the server per value: it needs --server-cmd with {} where the value goes");
  }

  std::optional<troupe::tokenizer> tokenizer;
  if (!o.tokenizer_dir.empty()) tokenizer = troupe::tokenizer::from_directory(o.tokenizer_dir);
  auto client = make_client(o);
  const auto requests = make_requests(o, client->form(), tokenizer ? &*tokenizer : nullptr);
  const bool progress = o.progress || ::isatty(STDERR_FILENO);
  bench_context bench{o, *client, requests, targets, progress};

  std::unique_ptr<server_process> server;
  if (o.sweep_rounds < 1) throw std::invalid_argument("--sweep-rounds must be at least 1");
  if (!o.server_cmd.empty() && !server_sweep) server = start_server(o, *client, "", "server.log");
  if (!server_sweep) bench.warm_up();

  nlohmann::json out = {{"settings", settings_json(o)}};
  if (sweep) {
    std::vector<sweep_row> rows;
    nlohmann::json runs = nlohmann::json::array();
    // Rounds alternate the order of the values, so that load from elsewhere that comes and goes
    // during the sweep does not fall on the same values each time.
    for (int round = 0; round < o.sweep_rounds; ++round) {
      std::vector<std::string> order = sweep->values;
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      for (const auto& value : order) {
        std::unique_ptr<server_process> per_value;
        if (server_sweep) {
          per_value = start_server(o, *client, value, "server-" + sweep->key + "-" + value + ".log");
          bench.warm_up();
        }
        sweep_row row;
        row.value = value;
        row.round = round;
        nlohmann::json run_json = {{sweep->key, value}, {"round", round}};
        if (o.find_goodput) {
          const goodput_result g = bench.search();
          row.goodput_rate = g.rate;
          run_json["goodput"] = goodput_json(g);
          std::printf("%s=%s: ", sweep->key.c_str(), value.c_str());
          print_goodput(g, o.goodput_target);
          // The row's latencies: one more run at the goodput rate found (or the lowest tried).
          const double at = g.rate.value_or(g.probes.empty() ? o.goodput_start_rate : g.probes.back().rate);
          row.summary = bench.run(at).first;
        } else {
          row.summary = bench.run(sweep->is_rate() ? std::stod(value) : rate).first;
        }
        std::printf("%s=%s\n%s", sweep->key.c_str(), value.c_str(), format_summary(row.summary).c_str());
        std::fflush(stdout);
        run_json["summary"] = to_json(row.summary);
        runs.push_back(run_json);
        rows.push_back(std::move(row));
      }
    }
    const auto files = write_sweep_outputs(o.out_dir, *sweep, rows, !targets.empty());
    for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
    out["sweep"] = {{"key", sweep->key}, {"runs", runs}};
    write_json(o.json_path, out);
    return 0;
  }
  if (o.find_goodput) {
    const goodput_result g = bench.search();
    print_goodput(g, o.goodput_target);
    out["goodput"] = goodput_json(g);
    write_json(o.json_path, out);
    return 0;
  }
  auto [summary, result] = bench.run(rate);
  std::printf("%s", format_summary(summary).c_str());
  out["summary"] = to_json(summary);
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : result.records) records.push_back(to_json(r));
  out["requests"] = records;
  write_json(o.json_path, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "troupe-bench: latency, throughput and goodput of a serving endpoint (Troupe's ZeroMQ protocol or the OpenAI "
      "HTTP API)"};
  app.add_option("--backend", o.backend, "troupe-zmq | openai")->capture_default_str();
  app.add_option("--endpoint", o.endpoint, "ZeroMQ endpoint (troupe-zmq)")->capture_default_str();
  app.add_option("--base-url", o.base_url, "http://host:port of an OpenAI-compatible server (openai)")
      ->capture_default_str();
  app.add_flag("--chat", o.chat, "use /v1/chat/completions instead of /v1/completions");
  app.add_option("--model", o.model, "the model to name in OpenAI requests (default: the first of GET /v1/models)");
  app.add_option("--api-key", o.api_key, "sent as api_key (ZeroMQ) or Authorization: Bearer (HTTP)");
  app.add_option("--dataset", o.dataset, "random | sharegpt")->capture_default_str();
  app.add_option("--dataset-path", o.dataset_path, "a ShareGPT-format JSON file");
  app.add_option("--input-len", o.input_len, "prompt tokens (random; the mean with a distribution)")
      ->capture_default_str();
  app.add_option("--output-len", o.output_len,
                 "output tokens (random: default 128; sharegpt: fixed instead of the gpt turn's length)");
  app.add_option("--input-dist", o.input_dist, "fixed | uniform | normal | lognormal")->capture_default_str();
  app.add_option("--output-dist", o.output_dist, "fixed | uniform | normal | lognormal")->capture_default_str();
  app.add_option("--input-spread", o.input_spread,
                 "uniform: +-share of the mean; normal: stddev / mean; lognormal: sigma")
      ->capture_default_str();
  app.add_option("--output-spread", o.output_spread, "as --input-spread, for output lengths")->capture_default_str();
  app.add_option("--shared-prefix-len", o.shared_prefix_len, "tokens every request of a group starts with")
      ->capture_default_str();
  app.add_option("--num-prefix-groups", o.num_prefix_groups, "groups of shared-prefix requests (round-robin)")
      ->capture_default_str();
  app.add_option("--vocab-size", o.vocab_size, "random token ids are drawn from [3, this) (no --tokenizer)")
      ->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer_dir,
                 "a Hugging Face model directory: exact token counts, and text prompts of exactly that many tokens");
  app.add_option("--request-rate", o.request_rate, "requests/s (Poisson at --burstiness 1), or inf: all at once")
      ->capture_default_str();
  app.add_option("--burstiness", o.burstiness,
                 "gamma shape of the gaps between requests: 1 Poisson, < 1 burstier, > 1 more even")
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency,
                 "requests in flight at most (0: no bound); alone, a closed loop of N clients")
      ->capture_default_str();
  app.add_option("--num-prompts", o.num_prompts, "requests per run")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the lengths, prompts and arrivals")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  app.add_option("--num-speculative-tokens", o.num_speculative_tokens,
                 "send num_speculative_tokens with each request (Troupe: draft tokens verified per step, 0: off; "
                 "-1: not sent, the server's default)")
      ->check(CLI::Range(-1, 16))
      ->capture_default_str();
  app.add_flag("--no-ignore-eos", o.no_ignore_eos,
               "do not send ignore_eos (for servers that refuse it; outputs may then end early)");
  app.add_option("--timeout", o.timeout_s, "seconds one request may take")->capture_default_str();
  app.add_option("--json", o.json_path, "write the full result as JSON to this file");
  app.add_flag("--progress", o.progress, "a progress bar on stderr even when it is not a terminal");
  app.add_option("--slo", o.slo_text, "targets a request must meet, e.g. ttft=200ms,tpot=50ms (also e2e)");
  app.add_flag("--find-goodput", o.find_goodput,
               "search the highest rate at which --goodput-target of requests meet --slo");
  app.add_option("--goodput-start-rate", o.goodput_start_rate, "the search's first rate")->capture_default_str();
  app.add_option("--goodput-max-runs", o.goodput_max_runs, "the search's bound on runs")->capture_default_str();
  app.add_option("--goodput-target", o.goodput_target, "share of requests that must meet the SLO")
      ->capture_default_str();
  app.add_option("--goodput-tolerance", o.goodput_tolerance,
                 "the search stops when its bracket is narrower than this share")
      ->capture_default_str();
  app.add_option("--sweep", o.sweep_text,
                 "rate=1,2,4 or a server flag such as max-num-batched-tokens=256,512 (with --server-cmd)");
  app.add_option("--sweep-rounds", o.sweep_rounds,
                 "run the sweep this many times, alternating the order; the plots take each value's best round (lowest "
                 "median E2E)")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "requests sent and not counted before measuring (after each server start)")
      ->capture_default_str();
  app.add_option("--server-cmd", o.server_cmd,
                 "a server to start (per sweep value: {} is replaced by it), wait for and stop after");
  app.add_option("--server-timeout", o.server_timeout_s, "seconds to wait for the server command to answer")
      ->capture_default_str();
  app.add_option("--out", o.out_dir, "folder for the sweep's CSV and SVG plots and the server logs")
      ->capture_default_str();
  app.add_option("--replot", o.replot_csv, "draw the plots of a sweep.csv again into --out, without running anything");
  app.add_flag("--fake-server", o.fake_server, "serve as a test server with known delays instead of benchmarking");
  app.add_option("--zmq-endpoint", o.fake.zmq_endpoint, "fake server: ZeroMQ endpoint to bind");
  app.add_option("--http-port", o.fake.http_port, "fake server: HTTP port on 127.0.0.1");
  app.add_option("--ttft-ms", o.fake.ttft_ms, "fake server: admission -> first token")->capture_default_str();
  app.add_option("--tpot-ms", o.fake.tpot_ms, "fake server: time between tokens")->capture_default_str();
  app.add_option("--max-concurrency", o.fake.max_concurrency, "fake server: requests served at once; the rest wait")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, o.fake_server ? on_fake_server_signal : on_bench_signal);
  ::signal(SIGTERM, o.fake_server ? on_fake_server_signal : on_bench_signal);
  try {
    if (o.fake_server) return run_fake_server(o.fake, stop_requested);
    if (!o.replot_csv.empty()) {
      const auto [spec, rows] = read_sweep_csv(o.replot_csv);
      bool with_slo = false;
      for (const auto& r : rows) with_slo = with_slo || r.summary.slo_attainment.has_value();
      for (const auto& f : write_sweep_outputs(o.out_dir, spec, rows, with_slo)) std::printf("wrote %s\n", f.c_str());
      return 0;
    }
    return run_bench(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe-bench: %s\n", e.what());
    return 2;
  }
}
