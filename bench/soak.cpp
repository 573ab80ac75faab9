// troupe_soak: a long run at a steady share of capacity (issue 26), to see what only time shows —
// memory that grows, KV blocks or leases that are never given back, errors that come now and then.
// Not a test of the suite: its default is the 30 minutes. It starts the topology itself
// (`troupe serve --config` colocated, or `troupe launch` of a 1P1D pair with its own certificates)
// on 127.0.0.1, measures the capacity (a closed loop at --probe-concurrency), then sends Poisson
// load at --load of it in windows of --window-s seconds, each one `troupe-bench` run, while a
// sampler records every 5 s the RSS of every process of the topology and the server's stats (KV
// blocks free, leases, requests in flight). At the end the server must go idle with every block
// free and no lease, no request may have failed, and after --warmup-min every process's RSS must
// stay flat: its least-squares growth over the rest of the run at most --max-growth-mb.
//
//   troupe_soak --troupe build/bin/troupe --bench build/bin/troupe-bench
//       --model ../shared/models/stories260K/hf [--topology colocated|1p1d] [--minutes 30]
//       [--load 0.8 | --rate R] [--out DIR]
//
// Writes DIR/samples.csv (one row per sample and process) and DIR/windows.csv (one row per load
// window), and prints a summary; exit status 0 when every check held.

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_process.hpp"
#include "bench/bench_support.hpp"
#include "client/client.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;
using troupe::bench::child;
using troupe::bench::free_port;
using troupe::bench::load_average;
using troupe::bench::read_text;

struct options {
  std::string troupe, bench, model, topology = "colocated", out;
  double minutes = 30, warmup_minutes = 3, load = 0.8, rate = 0, max_growth_mb = 8;
  int window_s = 60, probe_concurrency = 16, input_len = 128, output_len = 64, vocab_size = 512;
};

// ---- the processes of the topology --------------------------------------------------------

// The process and every descendant, each named: the root is "controller", a `troupe node` by
// its --name, anything else by its pid.
std::map<std::string, pid_t> process_tree(pid_t root) {
  std::map<pid_t, pid_t> parent_of;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* entry = ::readdir(proc)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
      if (pid <= 0) continue;
      const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos) continue;
      std::istringstream rest(stat.substr(paren + 2));
      std::string state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      parent_of[pid] = ppid;
    }
    ::closedir(proc);
  }
  std::map<std::string, pid_t> named{{"controller", root}};
  std::vector<pid_t> frontier{root};
  for (int depth = 0; depth < 4 && !frontier.empty(); ++depth) {
    std::vector<pid_t> next;
    for (const auto& [pid, ppid] : parent_of) {
      if (std::find(frontier.begin(), frontier.end(), ppid) == frontier.end()) continue;
      std::string cmdline = read_text("/proc/" + std::to_string(pid) + "/cmdline");
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      std::string name = "pid" + std::to_string(pid);
      if (const size_t at = cmdline.find("--name "); at != std::string::npos) {
        name = cmdline.substr(at + 7, cmdline.find(' ', at + 7) - (at + 7));
      }
      named[name] = pid;
      next.push_back(pid);
    }
    frontier = std::move(next);
  }
  return named;
}

// Resident set size in MiB (VmRSS), or -1 when the process is gone.
double rss_mb(pid_t pid) {
  std::istringstream status(read_text("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// The topology file; for 1p1d also the certificates (made once, in `dir`).
fs::path write_topology(const options& o, const fs::path& dir, const std::string& endpoint, uint16_t http_port) {
  const fs::path file = dir / (o.topology + ".toml");
  std::ofstream out(file);
  out << "[model]\npath = \"" << fs::absolute(o.model).string() << "\"\n"
      << "[node]\ndevice = \"cpu\"\nthreads = 1\n"
      << "[frontend]\nzmq_endpoint = \"" << endpoint << "\"\n"
      << "[http]\nenabled = true\nhost = \"127.0.0.1\"\nport = " << http_port << "\n"
      << "[scheduler]\nmax_num_batched_tokens = 1024\nmax_num_seqs = 64\nkv_memory_mb = 64\n";
  if (o.topology == "1p1d") {
    out << "[cluster]\ncredentials = \"" << (dir / "certs").string() << "\"\nname = \"controller\"\n"
        << "[disaggregation]\nkv_transfer_timeout_ms = 10000\n"
        << "[[nodes]]\nname = \"prefill-a\"\naddress = \"127.0.0.1:" << free_port() << "\"\n"
        << "[[nodes]]\nname = \"decode-a\"\naddress = \"127.0.0.1:" << free_port() << "\"\n"
        << "[placement]\ntokenizers = [\"controller\"]\nprefill = [\"prefill-a\"]\ndecode = [\"decode-a\"]\n"
        << "detokenizers = [\"controller\"]\n";
  } else if (o.topology != "colocated") {
    throw std::runtime_error("unknown --topology '" + o.topology + "' (colocated or 1p1d)");
  }
  return file;
}

// ---- load windows ---------------------------------------------------------------------------

struct window_result {
  int num_requests = 0, num_completed = 0, num_errors = 0;
  double throughput = 0, ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;
  std::string first_error;
};

window_result run_bench(const options& o, const std::string& endpoint, const fs::path& json,
                        const std::vector<std::string>& load_args, const fs::path& log) {
  std::vector<std::string> args{o.bench,
                                "--endpoint",
                                endpoint,
                                "--input-len",
                                std::to_string(o.input_len),
                                "--output-len",
                                std::to_string(o.output_len),
                                "--vocab-size",
                                std::to_string(o.vocab_size),
                                "--json",
                                json.string()};
  args.insert(args.end(), load_args.begin(), load_args.end());
  {
    child bench(args, log);
    const auto deadline = clock_type::now() + std::chrono::seconds(o.window_s * 4 + 120);
    while (bench.alive() && clock_type::now() < deadline) std::this_thread::sleep_for(100ms);
    if (bench.alive()) throw std::runtime_error("troupe-bench did not finish its window; log:\n" + read_text(log));
    if (!WIFEXITED(bench.status()) || WEXITSTATUS(bench.status()) != 0) {
      throw std::runtime_error("troupe-bench failed; log:\n" + read_text(log));
    }
  }
  const nlohmann::json doc = nlohmann::json::parse(read_text(json));
  const nlohmann::json& s = doc.at("summary");
  window_result w;
  w.num_requests = s.at("num_requests").get<int>();
  w.num_completed = s.at("num_completed").get<int>();
  w.num_errors = s.at("num_errors").get<int>();
  w.throughput = s.at("request_throughput").get<double>();
  w.ttft_p50_ms = s.at("ttft").at("median_ms").get<double>();
  w.ttft_p99_ms = s.at("ttft").at("p99_ms").get<double>();
  w.tpot_p50_ms = s.at("tpot").at("median_ms").get<double>();
  w.tpot_p99_ms = s.at("tpot").at("p99_ms").get<double>();
  if (s.contains("errors") && s.at("errors").is_array() && !s.at("errors").empty()) {
    w.first_error = s.at("errors").at(0).dump();
  }
  return w;
}

// ---- the sampler ----------------------------------------------------------------------------

struct sample {
  double t = 0;  // seconds since the load began
  std::map<std::string, double> rss;
  troupe::stats_reply stats;
  bool stats_ok = false;
};

class sampler {
 public:
  sampler(pid_t root, std::string endpoint, fs::path csv) : root_(root), endpoint_(std::move(endpoint)), csv_(csv) {
    csv_ << "t_s,process,rss_mb,free_blocks,total_blocks,kv_leases,waiting_for_kv,in_flight\n";
    thread_ = std::thread([this] { loop(); });
  }
  ~sampler() { stop(); }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<sample> samples() {
    std::lock_guard lock(mutex_);
    return samples_;
  }

 private:
  void loop() {
    const auto start = clock_type::now();
    for (int i = 0; i < 1000000 && !stopping_; ++i) {
      sample s;
      s.t = std::chrono::duration<double>(clock_type::now() - start).count();
      for (const auto& [name, pid] : process_tree(root_)) s.rss[name] = rss_mb(pid);
      try {
        troupe::client c(endpoint_);
        c.set_timeout(5s);
        s.stats = c.stats();
        s.stats_ok = true;
      } catch (const std::exception&) {
      }
      for (const auto& [name, mb] : s.rss) {
        csv_ << s.t << ',' << name << ',' << mb << ',' << s.stats.num_free_blocks << ',' << s.stats.num_total_blocks
             << ',' << s.stats.num_kv_leases << ',' << s.stats.num_waiting_for_kv << ','
             << s.stats.num_requests_in_flight << '\n';
      }
      csv_.flush();
      {
        std::lock_guard lock(mutex_);
        samples_.push_back(std::move(s));
      }
      for (int k = 0; k < 50 && !stopping_; ++k) std::this_thread::sleep_for(100ms);
    }
  }

  pid_t root_;
  std::string endpoint_;
  std::ofstream csv_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<sample> samples_;
  std::thread thread_;
};

// Least-squares slope of y over x (per unit of x); 0 with fewer than two points.
double slope(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return 0;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += x[i], my += y[i];
  mx /= static_cast<double>(n), my /= static_cast<double>(n);
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < n; ++i) sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  return sxx > 0 ? sxy / sxx : 0;
}

int num_failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++num_failures;
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  CLI::App app{"troupe_soak: a long run at a share of measured capacity; RSS, KV blocks and leases, errors"};
  app.add_option("--troupe", o.troupe, "the troupe binary")->required();
  app.add_option("--bench", o.bench, "the troupe-bench binary")->required();
  app.add_option("--model", o.model, "the model to serve")->required();
  app.add_option("--topology", o.topology, "colocated | 1p1d")->check(CLI::IsMember({"colocated", "1p1d"}));
  app.add_option("--out", o.out, "folder for samples.csv, windows.csv and the logs (default: a temp folder)");
  app.add_option("--minutes", o.minutes, "length of the run");
  app.add_option("--warmup-min", o.warmup_minutes, "minutes before RSS must stay flat");
  app.add_option("--load", o.load, "share of the measured capacity to send");
  app.add_option("--rate", o.rate, "requests/s to send instead (no capacity probe)");
  app.add_option("--max-growth-mb", o.max_growth_mb, "RSS growth after warm-up allowed per process");
  app.add_option("--window-s", o.window_s, "seconds of load per troupe-bench run");
  app.add_option("--probe-concurrency", o.probe_concurrency, "clients of the capacity probe's closed loop");
  app.add_option("--input-len", o.input_len, "prompt tokens");
  app.add_option("--output-len", o.output_len, "output tokens");
  app.add_option("--vocab-size", o.vocab_size, "random prompt ids are drawn below this");
  CLI11_PARSE(app, argc, argv);
  if (o.minutes <= o.warmup_minutes) throw std::runtime_error("--minutes must exceed --warmup-min");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const fs::path dir =
      o.out.empty() ? fs::temp_directory_path() / ("troupe_soak_" + std::to_string(::getpid())) : fs::path(o.out);
  fs::create_directories(dir);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  const fs::path topology = write_topology(o, dir, endpoint, free_port());
  if (o.topology == "1p1d") {
    troupe::bench::make_cluster_certs(o.troupe, dir, {"controller", "prefill-a", "decode-a"});
  }
  const std::vector<std::string> server_args =
      o.topology == "1p1d"
          ? std::vector<std::string>{o.troupe, "launch", topology.string(), "--log-level", "info"}
          : std::vector<std::string>{o.troupe, "serve", "--config", topology.string(), "--log-level", "info"};
  child server(server_args, dir / "server.log");
  server.wait_for("serving: ZeroMQ on", "the server (" + o.topology + ")", 180s);
  std::printf("troupe_soak: %s, %.0f minutes, %u hardware threads, load average %.1f, files in %s\n",
              o.topology.c_str(), o.minutes, std::thread::hardware_concurrency(), load_average(), dir.c_str());

  // Capacity: a closed loop of --probe-concurrency clients (after a short warm-up of its own).
  double rate = o.rate;
  if (rate <= 0) {
    run_bench(o, endpoint, dir / "probe-warmup.json",
              {"--request-rate", "inf", "--concurrency", std::to_string(o.probe_concurrency), "--num-prompts", "16"},
              dir / "probe-warmup.log");
    const window_result probe =
        run_bench(o, endpoint, dir / "probe.json",
                  {"--request-rate", "inf", "--concurrency", std::to_string(o.probe_concurrency), "--num-prompts",
                   std::to_string(o.probe_concurrency * 6)},
                  dir / "probe.log");
    rate = o.load * probe.throughput;
    std::printf("capacity: %.2f requests/s at concurrency %d (%d-token prompts, %d-token outputs); soak at %.2f/s\n",
                probe.throughput, o.probe_concurrency, o.input_len, o.output_len, rate);
  }
  if (!(rate > 0)) throw std::runtime_error("no positive rate to soak at");

  sampler samples(server.pid(), endpoint, dir / "samples.csv");
  std::ofstream windows(dir / "windows.csv");
  windows << "window,start_s,requests,completed,errors,throughput,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms\n";
  const auto start = clock_type::now();
  const auto end = start + std::chrono::duration<double>(o.minutes * 60);
  int total_requests = 0, total_errors = 0, total_completed = 0;
  std::string first_error;
  const int per_window = std::max(1, static_cast<int>(std::lround(rate * o.window_s)));
  for (int w = 0; w < 100000 && clock_type::now() < end && server.alive(); ++w) {
    const double at = std::chrono::duration<double>(clock_type::now() - start).count();
    const window_result r = run_bench(o, endpoint, dir / "window.json",
                                      {"--request-rate", std::to_string(rate), "--num-prompts",
                                       std::to_string(per_window), "--seed", std::to_string(w + 1)},
                                      dir / "window.log");
    total_requests += r.num_requests;
    total_completed += r.num_completed;
    total_errors += r.num_errors;
    if (first_error.empty()) first_error = r.first_error;
    windows << w << ',' << at << ',' << r.num_requests << ',' << r.num_completed << ',' << r.num_errors << ','
            << r.throughput << ',' << r.ttft_p50_ms << ',' << r.ttft_p99_ms << ',' << r.tpot_p50_ms << ','
            << r.tpot_p99_ms << '\n';
    windows.flush();
    std::printf("  window %3d at %6.0f s: %d/%d completed, %d errors, %.2f req/s, TTFT p50 %.0f ms p99 %.0f ms\n", w,
                at, r.num_completed, r.num_requests, r.num_errors, r.throughput, r.ttft_p50_ms, r.ttft_p99_ms);
  }
  const bool alive = server.alive();

  // Idle: nothing in flight, every block free, no lease (30 s at most).
  troupe::stats_reply last;
  bool idle = false;
  for (int i = 0; i < 300 && !idle && alive; ++i) {
    try {
      troupe::client c(endpoint);
      c.set_timeout(5s);
      last = c.stats();
      idle = last.num_requests_in_flight == 0 && last.num_kv_leases == 0 && last.num_waiting_for_kv == 0 &&
             last.num_free_blocks == last.num_total_blocks;
    } catch (const std::exception&) {
    }
    if (!idle) std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(6s);  // one more sample of the idle server
  samples.stop();

  std::printf("summary (%s, %.1f requests/s, load average %.1f at the end):\n", o.topology.c_str(), rate,
              load_average());
  check(alive, "the server ran to the end");
  check(total_errors == 0 && total_completed == total_requests,
        std::to_string(total_completed) + " of " + std::to_string(total_requests) + " requests completed, " +
            std::to_string(total_errors) + " errors" + (first_error.empty() ? "" : " (first: " + first_error + ")"));
  check(idle, "idle at the end: " + std::to_string(last.num_requests_in_flight) + " in flight, " +
                  std::to_string(last.num_free_blocks) + "/" + std::to_string(last.num_total_blocks) +
                  " blocks free, " + std::to_string(last.num_kv_leases) + " KV leases");
  // RSS after warm-up, per process: its fitted growth over the rest of the run.
  const std::vector<sample> all = samples.samples();
  const double warm = o.warmup_minutes * 60;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> series;
  for (const sample& s : all) {
    if (s.t < warm) continue;
    for (const auto& [name, mb] : s.rss) {
      if (mb < 0) continue;
      series[name].first.push_back(s.t);
      series[name].second.push_back(mb);
    }
  }
  for (const auto& [name, xy] : series) {
    const auto& [t, mb] = xy;
    const double per_s = slope(t, mb);
    const double span = t.empty() ? 0 : t.back() - t.front();
    const double growth = per_s * span;
    const auto [low, high] = std::minmax_element(mb.begin(), mb.end());
    std::printf(
        "  %-12s RSS after warm-up: %.1f -> %.1f MiB (min %.1f, max %.1f), fitted growth %+.2f MiB over "
        "%.0f s (%+.2f MiB/hour)\n",
        name.c_str(), mb.front(), mb.back(), *low, *high, growth, span, per_s * 3600);
    check(growth <= o.max_growth_mb, name + " RSS flat after warm-up (fitted growth " + std::to_string(growth) +
                                         " MiB <= " + std::to_string(o.max_growth_mb) + ")");
  }
  check(!series.empty(), "RSS was sampled after warm-up");
  server.stop(20s);
  std::printf("%s: %d failed check%s; samples in %s\n", num_failures ? "FAILED" : "passed", num_failures,
              num_failures == 1 ? "" : "s", (dir / "samples.csv").c_str());
  return num_failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_soak: %s\n", e.what());
  return 2;
}
