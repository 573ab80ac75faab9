// The cluster against one process, in one run on one machine (issue 10). It starts every
// process itself (`troupe certs` into a temp dir, `troupe node` per engine node, `troupe serve
// --config` for the controller, free 127.0.0.1 ports, HTTP off) and stops them all at the end:
//
//   colocated  `troupe serve`, every stage in one process, [node] threads = --threads
//   remote-1   the controller plus one `troupe node` holding the engine (scheduler + worker),
//              threads = --threads: the cost of the process boundary (TLS, one more hop per
//              token batch, serialized step results)
//   remote-2   two nodes, an engine each, threads = --threads / 2: the same total threads, so
//              on a small machine this shows the router spreading requests, not a speed-up
//   kill       remote-2 with --kill-streams streams of --kill-decode tokens; once every stream
//              has its first token and --kill-after-ms more have passed, one engine node gets
//              SIGKILL. Per stream the client records when each delta arrived; the figure is
//              the time from the kill to the next token of the requests that were on the
//              killed node (the K streams with the longest silence after the kill, K taken from
//              the router's log line "re-running its K requests"; the longest silence among the
//              other streams is printed beside it, so the split can be checked). A fresh cluster
//              for every trial; the killed node alternates.
//
// Requests are ZeroMQ clients (one per stream, streaming, greedy, ignore_eos, a different
// prompt of --prompt token ids per request so the prefix cache shares nothing). Latency is per
// request, client-side: end-to-end (sent -> last delta) and TTFT (sent -> first delta with a
// token). tok/s is every output token over the time the rounds took, prompts included.
//
//   troupe_bench_cluster --troupe build/bin/troupe --model ../shared/models/stories260K/hf
//       [--threads 2] [--prompt 32] [--decode 128] [--single-requests 10] [--rounds 3]
//       [--streams 32 (1: the single-stream rows only)] [--kill-trials 5] [--kill-streams 32] [--kill-decode 400]
//       [--kill-after-ms 150] [--parts colocated,remote-1,remote-2,kill] [--cycles 1]
//       [--load-format auto] [--keep-dir]

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct options {
  std::string troupe, model, load_format = "auto", parts = "colocated,remote-1,remote-2,kill";
  int threads = 2, prompt = 32, decode = 128, single_requests = 10, rounds = 3, streams = 32;
  int kill_trials = 5, kill_streams = 32, kill_decode = 400, kill_after_ms = 150, cycles = 1;
  bool keep_dir = false;
};

// One cluster layout, started from scratch: certs are made once per run, in `dir`.
class cluster {
 public:
  // engine_nodes empty: colocated (`troupe serve`, no [cluster]); else one engine per node.
  cluster(const options& o, const fs::path& dir, const std::string& label, const std::vector<std::string>& engine_nodes,
          int threads)
      : endpoint_("tcp://127.0.0.1:" + std::to_string(free_port())) {
    const fs::path topology = dir / (label + ".toml");
    std::ofstream out(topology);
    out << "[model]\npath = \"" << o.model << "\"\nload_format = \"" << o.load_format << "\"\n"
        << "[node]\ndevice = \"cpu\"\nthreads = " << threads << "\n"
        << "[frontend]\nzmq_endpoint = \"" << endpoint_ << "\"\n"
        << "[http]\nenabled = false\n"
        << "[tokenizer]\npool_size = 2\n"
        << "[scheduler]\nmax_num_batched_tokens = 2048\nmax_num_seqs = 128\nkv_memory_mb = 256\n";
    if (!engine_nodes.empty()) {
      out << "[cluster]\ncredentials = \"" << (dir / "certs").string() << "\"\nname = \"controller\"\n"
          << "heartbeat_interval_ms = 500\nconnection_timeout_ms = 3000\nreconnect_interval_ms = 500\n";
      std::string names;
      for (const std::string& n : engine_nodes) {
        const std::string address = "127.0.0.1:" + std::to_string(free_port());
        out << "[[nodes]]\nname = \"" << n << "\"\naddress = \"" << address << "\"\n";
        names += (names.empty() ? "\"" : ", \"") + n + "\"";
        nodes_[n] = std::make_unique<child>(
            std::vector<std::string>{o.troupe, "node", "--listen", address, "--credentials", (dir / "certs").string(),
                                     "--name", n, "--log-level", "info"},
            dir / (label + "-" + n + ".log"));
      }
      out << "[placement]\ntokenizers = [\"controller\"]\nengines = [" << names
          << "]\ndetokenizers = [\"controller\"]\n";
    }
    out.close();
    for (auto& [name, node] : nodes_) node->wait_for("node " + name + " listening on", name);
    controller_ = std::make_unique<child>(
        std::vector<std::string>{o.troupe, "serve", "--config", topology.string(), "--log-level", "info"},
        dir / (label + "-controller.log"));
    controller_->wait_for("zmq door: listening on", "the controller (" + label + ")");
  }
  ~cluster() {
    controller_.reset();  // the controller first: its remote stages end with it
    nodes_.clear();
  }

  const std::string& endpoint() const { return endpoint_; }
  child& node(const std::string& name) { return *nodes_.at(name); }
  std::string controller_log() const { return controller_->log(); }

  // CPU seconds used so far by each process: "controller" and every node by name.
  std::map<std::string, double> cpu_seconds() const {
    std::map<std::string, double> out{{"controller", controller_->cpu_seconds()}};
    for (const auto& [name, node] : nodes_) out[name] = node->cpu_seconds();
    return out;
  }

 private:
  std::string endpoint_;
  std::map<std::string, std::unique_ptr<child>> nodes_;
  std::unique_ptr<child> controller_;
};

struct request_record {
  clock_type::time_point sent, first_token, done;
  std::vector<clock_type::time_point> deltas;  // arrival of each delta that carried tokens
  int num_tokens = 0;
  std::string error;
};

int g_prompt_salt = 0;  // every request in the run gets a prompt of its own

std::vector<int32_t> prompt_ids(int length, int vocab, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(3 + (salt * 131 + i * 11 + (salt / 7) * i) % (vocab - 6));
  return ids;
}

// One streaming greedy request on `c`, recorded.
void run_request(troupe::client& c, int prompt, int decode, int vocab, int salt, request_record& r) {
  troupe::generate_request req;
  req.prompt_token_ids = prompt_ids(prompt, vocab, salt);
  req.sampling.temperature = 0.0f;
  req.sampling.max_tokens = decode;
  req.sampling.ignore_eos = true;
  req.stream = true;
  r.sent = clock_type::now();
  try {
    auto out = c.generate(req, [&](const troupe::delta_reply& d) {
      if (d.token_ids.empty()) return;
      const auto now = clock_type::now();
      if (r.deltas.empty()) r.first_token = now;
      r.deltas.push_back(now);
    });
    r.num_tokens = static_cast<int>(out.token_ids.size());
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.done = clock_type::now();
}

// `num_streams` threads, each sending `per_stream` requests one after another, all starting
// together. Returns the records and the seconds from the start to the last one's end.
double run_streams(const std::string& endpoint, int num_streams, int per_stream, int prompt, int decode, int vocab,
                   std::vector<request_record>& records) {
  records.assign(static_cast<size_t>(num_streams * per_stream), {});
  const int salt0 = g_prompt_salt;
  g_prompt_salt += num_streams * per_stream;
  std::barrier start(num_streams + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < num_streams; ++s) {
    threads.emplace_back([&, s] {
      std::optional<troupe::client> c;
      try {
        c.emplace(endpoint);
        c->set_timeout(5min);
      } catch (const std::exception& e) {
        records[s * per_stream].error = e.what();
      }
      start.arrive_and_wait();
      if (!c) return;
      for (int k = 0; k < per_stream; ++k) {
        run_request(*c, prompt, decode, vocab, salt0 + s * per_stream + k, records[s * per_stream + k]);
      }
    });
  }
  start.arrive_and_wait();
  const auto begin = clock_type::now();
  for (auto& t : threads) t.join();
  return seconds_between(begin, clock_type::now());
}

void check(const std::vector<request_record>& records, int decode) {
  for (const auto& r : records) {
    if (!r.error.empty()) throw std::runtime_error("a request failed: " + r.error);
    if (r.num_tokens != decode) {
      throw std::runtime_error("a request got " + std::to_string(r.num_tokens) + " tokens, expected " +
                               std::to_string(decode));
    }
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t index = static_cast<size_t>(std::min<double>(v.size() - 1, std::ceil(p / 100.0 * v.size()) - 1));
  return v[index];
}
double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

struct row {
  std::string layout;
  int streams = 0;
  double tokens_per_s = 0, best_tokens_per_s = 0, e2e_mean = 0, e2e_p50 = 0, e2e_p99 = 0, ttft_mean = 0, ttft_p50 = 0,
         ttft_p99 = 0;
  double load = 0;
  int samples = 0;
};

// Warm-up round, then the measured ones: --single-requests requests one after another at 1
// stream, --rounds rounds of --streams at once.
row measure(const options& o, const cluster& c, const std::string& layout, int streams, int vocab) {
  const std::string& endpoint = c.endpoint();
  std::vector<request_record> warm;
  run_streams(endpoint, streams, 1, o.prompt, o.decode, vocab, warm);
  check(warm, o.decode);
  std::vector<request_record> all;
  double seconds = 0;
  const auto cpu_before = c.cpu_seconds();
  const int rounds = streams == 1 ? 1 : o.rounds;
  const int per_stream = streams == 1 ? o.single_requests : 1;
  // The best round (at 1 stream: the best request) beside the average: on a shared machine the
  // average carries every moment another process took the cores, the best one the fewest.
  double best = 0;
  for (int i = 0; i < rounds; ++i) {
    std::vector<request_record> records;
    const double round_seconds = run_streams(endpoint, streams, per_stream, o.prompt, o.decode, vocab, records);
    seconds += round_seconds;
    check(records, o.decode);
    if (streams > 1) best = std::max(best, streams * o.decode / round_seconds);
    for (const auto& r : records) {
      if (streams == 1) best = std::max(best, r.num_tokens / seconds_between(r.sent, r.done));
    }
    all.insert(all.end(), records.begin(), records.end());
  }
  std::vector<double> e2e, ttft;
  int tokens = 0;
  for (const auto& r : all) {
    e2e.push_back(seconds_between(r.sent, r.done));
    ttft.push_back(seconds_between(r.sent, r.first_token));
    tokens += r.num_tokens;
  }
  // Where the CPU went, per 1000 output tokens and process: on 2 cores the processes compete,
  // so the cost of the process boundary shows here before it shows in tok/s.
  std::string cpu;
  for (const auto& [name, after] : c.cpu_seconds()) {
    char item[96];
    std::snprintf(item, sizeof item, "%s%s %.0f ms", cpu.empty() ? "" : ", ", name.c_str(),
                  (after - cpu_before.at(name)) * 1e6 / tokens);
    cpu += item;
  }
  row out{layout,
          streams,
          tokens / seconds,
          best,
          mean(e2e),
          percentile(e2e, 50),
          percentile(e2e, 99),
          mean(ttft),
          percentile(ttft, 50),
          percentile(ttft, 99),
          load_average(),
          static_cast<int>(all.size())};
  std::printf(
      "  %-10s streams %2d: %7.1f tok/s (best %s %.1f)  e2e mean %.3f p50 %.3f p99 %.3f s  ttft mean %.4f p50 %.4f p99 "
      "%.4f s"
      "  (%d requests, load %.2f)\n    CPU per 1000 tokens: %s\n",
      layout.c_str(), streams, out.tokens_per_s, streams == 1 ? "request" : "round", out.best_tokens_per_s,
      out.e2e_mean, out.e2e_p50, out.e2e_p99, out.ttft_mean, out.ttft_p50, out.ttft_p99, out.samples, out.load,
      cpu.c_str());
  std::fflush(stdout);
  return out;
}

struct kill_trial {
  std::string node;
  int rerun = -1;                   // K from the router's log line
  std::vector<double> affected_ms;  // kill -> next token, the K longest silences
  double others_max_ms = 0;         // the longest silence after the kill among the others
  double noticed_ms = -1;           // kill -> the router's log line (its clock, ms resolution)
};

// "[2026-11-24 03:31:49.179] ..." at the start of `line` as a system_clock time (the log's local time).
std::optional<std::chrono::system_clock::time_point> log_time(const std::string& line) {
  std::tm tm{};
  int millis = 0;
  if (std::sscanf(line.c_str(), "[%d-%d-%d %d:%d:%d.%d]", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec, &millis) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm)) + std::chrono::milliseconds(millis);
}

// One fresh two-node cluster; kills `victim` mid-stream and measures the silences.
kill_trial run_kill_trial(const options& o, const fs::path& dir, int trial, int vocab) {
  const std::string victim = trial % 2 == 0 ? "engine-a" : "engine-b";
  cluster c(o, dir, "kill-" + std::to_string(trial), {"engine-a", "engine-b"}, std::max(1, o.threads / 2));
  std::vector<request_record> warm;
  run_streams(c.endpoint(), 4, 1, o.prompt, 16, vocab, warm);
  check(warm, 16);

  const int n = o.kill_streams;
  std::vector<request_record> records(static_cast<size_t>(n));
  std::vector<std::unique_ptr<std::atomic<bool>>> started;
  for (int i = 0; i < n; ++i) started.push_back(std::make_unique<std::atomic<bool>>(false));
  const int salt0 = g_prompt_salt;
  g_prompt_salt += n;
  std::barrier start(n + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) {
    threads.emplace_back([&, s] {
      std::optional<troupe::client> cl;
      auto& r = records[s];
      try {
        cl.emplace(c.endpoint());
        cl->set_timeout(5min);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      start.arrive_and_wait();  // before anything that can fail: a missing arrival would hang the trial
      if (!cl) {
        started[s]->store(true);
        return;
      }
      troupe::generate_request req;
      req.prompt_token_ids = prompt_ids(o.prompt, vocab, salt0 + s);
      req.sampling.temperature = 0.0f;
      req.sampling.max_tokens = o.kill_decode;
      req.sampling.ignore_eos = true;
      r.sent = clock_type::now();
      try {
        auto out = cl->generate(req, [&](const troupe::delta_reply& d) {
          if (d.token_ids.empty()) return;
          const auto now = clock_type::now();
          if (r.deltas.empty()) r.first_token = now;
          r.deltas.push_back(now);
          started[s]->store(true);
        });
        r.num_tokens = static_cast<int>(out.token_ids.size());
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      started[s]->store(true);  // also on failure: the waiter below must not wait for it
      r.done = clock_type::now();
    });
  }
  start.arrive_and_wait();
  // Every stream has its first token (so every request sits on an instance), then the delay.
  const auto deadline = clock_type::now() + 60s;
  for (int i = 0; i < 60000 && clock_type::now() < deadline; ++i) {
    if (std::all_of(started.begin(), started.end(), [](const auto& f) { return f->load(); })) break;
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(o.kill_after_ms));
  const auto killed_at = clock_type::now();
  const auto killed_at_wall = std::chrono::system_clock::now();
  c.node(victim).kill_now();
  for (auto& t : threads) t.join();
  check(records, o.kill_decode);

  kill_trial out;
  out.node = victim;
  static const std::regex rerun_line(R"((\[[^\]]*\]).*re-running its ([0-9]+) requests)");
  const std::string log = c.controller_log();
  std::smatch m;
  if (std::regex_search(log, m, rerun_line)) {
    out.rerun = std::stoi(m[2]);
    if (const auto at = log_time(m[1])) {
      out.noticed_ms = std::chrono::duration<double, std::milli>(*at - killed_at_wall).count();
    }
  }
  // Per stream still running at the kill, its longest silence after it: from the kill (or the
  // delta before, when later) to the next delta. Not simply the first delta after the kill: a
  // token batch the node sent just before it died can still arrive a moment later.
  std::vector<double> silences;
  for (const auto& r : records) {
    auto next = std::upper_bound(r.deltas.begin(), r.deltas.end(), killed_at);
    if (next == r.deltas.end()) continue;  // it had finished before the kill
    double longest = 0;
    for (auto it = next; it != r.deltas.end(); ++it) {
      const auto from = it == r.deltas.begin() ? killed_at : std::max(killed_at, *(it - 1));
      longest = std::max(longest, seconds_between(from, *it) * 1000.0);
    }
    silences.push_back(longest);
  }
  std::sort(silences.rbegin(), silences.rend());
  const size_t k = out.rerun < 0 ? 0 : std::min(silences.size(), static_cast<size_t>(out.rerun));
  out.affected_ms.assign(silences.begin(), silences.begin() + static_cast<long>(k));
  if (k < silences.size()) out.others_max_ms = silences[k];
  std::sort(out.affected_ms.begin(), out.affected_ms.end());
  std::printf(
      "  kill trial %d (%s): router re-ran %d requests; kill -> next token of those: min %.1f median %.1f "
      "max %.1f ms; longest silence of the other %zu streams %.1f ms; the router logged the loss %.0f ms "
      "after the kill (load %.2f)\n",
      trial, victim.c_str(), out.rerun, out.affected_ms.empty() ? 0 : out.affected_ms.front(),
      percentile(out.affected_ms, 50), out.affected_ms.empty() ? 0 : out.affected_ms.back(), silences.size() - k,
      out.others_max_ms, out.noticed_ms, load_average());
  std::fflush(stdout);
  return out;
}

int read_vocab(const std::string& model) {
  fs::path config = fs::path(model) / "config.json";
  if (fs::path(model).filename() == "config.json") config = model;
  std::ifstream in(config);
  if (!in) throw std::runtime_error("--model " + model + ": no config.json there to read vocab_size from");
  const auto j = nlohmann::json::parse(in);
  if (!j.contains("vocab_size")) throw std::runtime_error(config.string() + " has no vocab_size");
  return j.at("vocab_size").get<int>();
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--keep-dir") {
      o.keep_dir = true;
      continue;
    }
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    const std::map<std::string, int*> ints = {{"--threads", &o.threads},
                                              {"--prompt", &o.prompt},
                                              {"--decode", &o.decode},
                                              {"--single-requests", &o.single_requests},
                                              {"--rounds", &o.rounds},
                                              {"--streams", &o.streams},
                                              {"--kill-trials", &o.kill_trials},
                                              {"--kill-streams", &o.kill_streams},
                                              {"--kill-decode", &o.kill_decode},
                                              {"--kill-after-ms", &o.kill_after_ms},
                                              {"--cycles", &o.cycles}};
    if (flag == "--troupe")
      o.troupe = value;
    else if (flag == "--model")
      o.model = value;
    else if (flag == "--load-format")
      o.load_format = value;
    else if (flag == "--parts")
      o.parts = value;
    else if (auto it = ints.find(flag); it != ints.end())
      *it->second = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag + " (see the comment at the top of bench/cluster_bench.cpp)");
  }
  if (o.troupe.empty() || !fs::exists(o.troupe))
    throw std::runtime_error("--troupe PATH of the troupe binary is required");
  if (o.model.empty()) throw std::runtime_error("--model DIR is required");
  o.troupe = fs::absolute(o.troupe).string();
  o.model = fs::absolute(o.model).string();
  if (o.threads < 2 || o.threads % 2 != 0)
    throw std::runtime_error("--threads must be even and >= 2 (remote-2 halves it)");
  const int vocab = read_vocab(o.model);
  auto wants = [&](const std::string& part) {
    return ("," + o.parts + ",").find("," + part + ",") != std::string::npos;
  };

  std::string tmpl = (fs::temp_directory_path() / "troupe-cluster-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a temp dir from " + tmpl);
  const fs::path dir = tmpl;
  struct remover {
    fs::path dir;
    bool keep;
    ~remover() {
      if (keep)
        std::printf("kept %s\n", dir.c_str());
      else
        fs::remove_all(dir);
    }
  } remove_at_end{dir, o.keep_dir};

  const std::string certs = o.troupe + " certs --out " + (dir / "certs").string() +
                            " --name controller --name engine-a --name engine-b > " + (dir / "certs.log").string() +
                            " 2>&1";
  if (std::system(certs.c_str()) != 0) throw std::runtime_error("troupe certs failed: " + read_text(dir / "certs.log"));

  std::printf(
      "cluster bench: model %s, %u hardware threads, threads %d (remote-2: %d per node), prompt %d, decode %d, "
      "load average %.2f\n",
      o.model.c_str(), std::thread::hardware_concurrency(), o.threads, o.threads / 2, o.prompt, o.decode,
      load_average());
  std::vector<row> rows;
  for (int cycle = 0; cycle < o.cycles; ++cycle) {
    if (wants("colocated")) {
      cluster c(o, dir, "colocated", {}, o.threads);
      rows.push_back(measure(o, c, "colocated", 1, vocab));
      if (o.streams > 1) rows.push_back(measure(o, c, "colocated", o.streams, vocab));
    }
    if (wants("remote-1")) {
      cluster c(o, dir, "remote-1", {"engine-a"}, o.threads);
      rows.push_back(measure(o, c, "remote-1", 1, vocab));
      if (o.streams > 1) rows.push_back(measure(o, c, "remote-1", o.streams, vocab));
    }
    if (wants("remote-2")) {
      cluster c(o, dir, "remote-2", {"engine-a", "engine-b"}, o.threads / 2);
      rows.push_back(measure(o, c, "remote-2", o.streams, vocab));
    }
  }
  std::vector<double> all_affected;
  for (int t = 0; wants("kill") && t < o.kill_trials; ++t) {
    const kill_trial k = run_kill_trial(o, dir, t, vocab);
    all_affected.insert(all_affected.end(), k.affected_ms.begin(), k.affected_ms.end());
  }
  if (!all_affected.empty()) {
    std::sort(all_affected.begin(), all_affected.end());
    std::printf("kill -> next token over all trials (%zu re-run requests): min %.1f median %.1f max %.1f ms\n",
                all_affected.size(), all_affected.front(), percentile(all_affected, 50), all_affected.back());
  }
  std::printf("load average %.2f after the runs\n", load_average());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_cluster: %s\n", e.what());
  return 1;
}
