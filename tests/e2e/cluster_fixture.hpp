#pragma once
// What the cluster acceptance tests share: free 127.0.0.1 ports, credentials from `troupe certs`,
// a topology file written by the test, `troupe node` processes the test can kill -9 and restart
// on the same address, a controller (`troupe serve --config` or `troupe launch`) whose ports are
// read from its log, and a mix of requests sent over ZeroMQ and HTTP whose outputs are compared.
// Every process is stopped when its object ends, also when an assertion fails; every wait is
// bounded in count and time.

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test::cluster {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using troupe::test::free_port;

// `troupe certs --out DIR --name A --name B ...`: a CA of its own and one key pair per member.
inline void make_credentials(const fs::path& dir, const std::vector<std::string>& members) {
  std::string args = "certs --out " + shell_quote(dir.string());
  for (const auto& m : members) args += " --name " + shell_quote(m);
  const run_result made = run_troupe(args);
  if (made.exit_code != 0) throw std::runtime_error("troupe certs failed for " + dir.string() + ": " + made.err);
}

// How often `text` holds `words`.
inline int count_of(const std::string& text, const std::string& words) {
  int n = 0;
  for (size_t at = text.find(words); at != std::string::npos; at = text.find(words, at + words.size())) ++n;
  return n;
}

// The seed of a failover test's kill moments and victims: TROUPE_FAILOVER_SEED replays a logged
// run's; otherwise a fresh one, printed under `test` so that a failure can be replayed.
inline uint64_t failover_seed(const std::string& test) {
  const char* replay = std::getenv("TROUPE_FAILOVER_SEED");
  const uint64_t seed = replay ? std::stoull(replay) : std::random_device{}();
  std::printf("%s seed %llu (TROUPE_FAILOVER_SEED replays it)\n", test.c_str(), static_cast<unsigned long long>(seed));
  return seed;
}

// The sum of the first numbers in every match of `pattern` (one group) in `text`: what a log's
// lines count ("re-running its 3 requests").
inline int sum_of(const std::string& text, const std::regex& pattern) {
  int sum = 0;
  for (std::sregex_iterator i(text.begin(), text.end(), pattern), end; i != end; ++i) sum += std::stoi((*i)[1]);
  return sum;
}

// Waits (bounded) until `child` exits; false when it still runs after `bound`.
inline bool exits_within(const child_process& child, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (int i = 0; i < 5000 && child.alive() && std::chrono::steady_clock::now() < deadline; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  return !child.alive();
}

// `troupe serve --config FILE` expected to fail at start, its output in `log`.
inline child_process failing_controller(const fs::path& topology, const fs::path& log) {
  return child_process({troupe_binary.string(), "serve", "--config", topology.string(), "--zmq-endpoint",
                        "tcp://127.0.0.1:*", "--log-level", "info"},
                       log);
}

struct node_entry {
  std::string name;
  uint16_t port = 0;
  std::string kv_cache_dtype;  // the node's own; empty: [node]'s
};

// A topology file's contents. No credentials and no nodes: a colocated `troupe serve`.
struct topology_spec {
  std::string model_path = stories_dir;
  fs::path credentials;
  std::vector<node_entry> nodes;
  std::vector<std::string> tokenizers{"controller"};
  std::vector<std::string> engines{"controller"};
  std::vector<std::string> detokenizers{"controller"};
  std::vector<std::string> prefill;   // disaggregation: prefill-only instances
  std::vector<std::string> decode;    // and decode-only ones
  int max_num_batched_tokens = 2048;  // small: prompts are prefilled in chunks
  int kv_transfer_timeout_ms = 10000;
  int num_speculative_tokens = 0;  // [speculative] num_draft_tokens: the default for requests that do not choose
  bool admin = false;              // admin_listen on 127.0.0.1, port 0
  int connect_timeout_ms = 10000;
  int heartbeat_interval_ms = 500;
  int connection_timeout_ms = 3000;
  int reconnect_interval_ms = 200;
  int failover_wait_ms = -1;    // [cluster] failover_wait_ms; -1: the default
  std::string device = "auto";  // [node] device
  std::string dtype;            // [node] dtype (CUDA activations); empty: the default
  std::string kv_cache_dtype;   // [node] kv_cache_dtype; empty: the default (auto)
  std::string kv_transport;     // [disaggregation] kv_transport; empty: the default (zmq)
  std::string extra_toml;       // appended as is, after [placement] (e.g. [[plugins]] tables)

  std::string toml() const {
    std::ostringstream t;
    t << "[model]\npath = \"" << model_path << "\"\nload_format = \"auto\"\n"
      << "[node]\ndevice = \"" << device << "\"\nthreads = 1\n"
      << (dtype.empty() ? "" : "dtype = \"" + dtype + "\"\n")
      << (kv_cache_dtype.empty() ? "" : "kv_cache_dtype = \"" + kv_cache_dtype + "\"\n")
      << "[http]\nenabled = true\nhost = \"127.0.0.1\"\nport = 0\n"
      << "[tokenizer]\npool_size = 2\n"
      << "[scheduler]\nmax_num_batched_tokens = " << max_num_batched_tokens
      << "\nmax_num_seqs = 64\nkv_memory_mb = 32\n"
      << "[disaggregation]\nkv_transfer_timeout_ms = " << kv_transfer_timeout_ms << "\n";
    if (!kv_transport.empty()) t << "kv_transport = \"" << kv_transport << "\"\n";
    if (num_speculative_tokens > 0) t << "[speculative]\nnum_draft_tokens = " << num_speculative_tokens << "\n";
    if (credentials.empty()) return t.str() + extra_toml;
    t << "[cluster]\ncredentials = \"" << credentials.string() << "\"\nname = \"controller\"\n"
      << "connect_timeout_ms = " << connect_timeout_ms << "\nrequest_timeout_ms = 30000\n"
      << "heartbeat_interval_ms = " << heartbeat_interval_ms << "\nconnection_timeout_ms = " << connection_timeout_ms
      << "\nreconnect_interval_ms = " << reconnect_interval_ms << "\n";
    if (failover_wait_ms >= 0) t << "failover_wait_ms = " << failover_wait_ms << "\n";
    if (admin) t << "admin_listen = \"127.0.0.1:0\"\n";
    for (const auto& n : nodes) {
      t << "[[nodes]]\nname = \"" << n.name << "\"\naddress = \"127.0.0.1:" << n.port << "\"\n";
      if (!n.kv_cache_dtype.empty()) t << "kv_cache_dtype = \"" << n.kv_cache_dtype << "\"\n";
    }
    auto list = [](const std::vector<std::string>& names) {
      std::string out = "[";
      for (size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
      return out + "]";
    };
    t << "[placement]\ntokenizers = " << list(tokenizers) << "\nengines = " << list(engines)
      << "\ndetokenizers = " << list(detokenizers) << "\n";
    if (!prefill.empty()) t << "prefill = " << list(prefill) << "\n";
    if (!decode.empty()) t << "decode = " << list(decode) << "\n";
    t << extra_toml;
    return t.str();
  }

  fs::path write(const fs::path& path) const {
    std::ofstream(path) << toml();
    return path;
  }
};

// `troupe node --listen 127.0.0.1:PORT` on a port the test chose, so that a node killed with
// SIGKILL can be started again on the same address. Each start logs to a file of its own.
class node_process {
 public:
  node_process(fs::path credentials, std::string name, uint16_t port, fs::path dir)
      : credentials_(std::move(credentials)), name_(std::move(name)), port_(port), dir_(std::move(dir)) {
    start();
  }

  // Starts the node (again) and waits, bounded, until it logs that it listens; throws with its
  // log when it exits first or the bound passes.
  void start() {
    if (process_ && process_->alive()) throw std::logic_error("node " + name_ + " runs already");
    log_path_ = dir_ / (name_ + "." + std::to_string(num_starts_++) + ".log");
    process_.emplace(
        std::vector<std::string>{troupe_binary.string(), "node", "--listen", "127.0.0.1:" + std::to_string(port_),
                                 "--credentials", credentials_.string(), "--name", name_, "--log-level", "info"},
        log_path_);
    const std::string listening = "node " + name_ + " listening on";
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (int i = 0; i < 1500 && process_->alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      if (log().find(listening) != std::string::npos) return;
      std::this_thread::sleep_for(20ms);
    }
    const std::string text = log();
    process_->stop();
    throw std::runtime_error("troupe node " + name_ + " did not come up on port " + std::to_string(port_) +
                             "; its log:\n" + text);
  }

  // SIGKILL: no goodbye to the controller, no cleanup; reaped before this returns.
  void kill9() {
    if (!process_ || !process_->alive()) return;
    ::kill(process_->pid(), SIGKILL);
    process_->stop();  // reaps it (SIGTERM to a dead pid is harmless before waitpid)
  }

  bool alive() const { return process_ && process_->alive(); }
  const std::string& name() const { return name_; }
  uint16_t port() const { return port_; }
  node_entry entry() const { return {name_, port_}; }
  std::string log() const { return read_file(log_path_); }

 private:
  fs::path credentials_;
  std::string name_;
  uint16_t port_;
  fs::path dir_;
  int num_starts_ = 0;
  fs::path log_path_;
  std::optional<child_process> process_;
};

// A controller: `troupe serve --config FILE` or `troupe launch FILE` (which starts the file's
// nodes as its children first). Its ZeroMQ endpoint, HTTP port and admin port are read from its
// log; it is up when it answers a stats request.
class controller_process {
 public:
  enum class kind { serve, launch };

  // Starts it and waits (bounded) until it serves; throws with its log when it does not.
  controller_process(kind how, const fs::path& topology, const fs::path& log) : log_path_(log) {
    std::vector<std::string> args = {troupe_binary.string()};
    if (how == kind::serve) {
      args.insert(args.end(), {"serve", "--config", topology.string()});
    } else {
      args.insert(args.end(), {"launch", topology.string()});
    }
    args.insert(args.end(), {"--zmq-endpoint", "tcp://127.0.0.1:*", "--log-level", "info"});
    process_.emplace(std::move(args), log_path_);
    if (!wait_until_serving(90s)) {
      const std::string text = this->log();
      process_->stop();
      throw std::runtime_error(std::string("the controller did not come up; its log:\n") + text);
    }
  }

  // Waits (bounded) until it exits; its waitpid status, or -1 when it still runs.
  int wait_for_exit(std::chrono::seconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (int i = 0; i < 5000 && process_->alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      std::this_thread::sleep_for(20ms);
    }
    return process_->alive() ? -1 : process_->exit_status();
  }

  // Waits (bounded) until its log holds `words` at least `times` times.
  bool wait_for_log(const std::string& words, int times, std::chrono::milliseconds bound) const {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (int i = 0; i < 5000 && std::chrono::steady_clock::now() < deadline; ++i) {
      if (count_of(log(), words) >= times) return true;
      std::this_thread::sleep_for(20ms);
    }
    return count_of(log(), words) >= times;
  }

  // The pids of the nodes `troupe launch` started, from its `started NAME (pid N)` lines.
  std::map<std::string, pid_t> launched_pids() const { return launched_pids_in(log()); }

  const std::string& endpoint() const { return endpoint_; }
  int http_port() const { return http_port_; }
  int admin_port() const { return admin_port_; }
  const std::string& model_id() const { return model_id_; }
  client make_client(std::chrono::milliseconds timeout = 60s) const {
    client c(endpoint_);
    c.set_timeout(timeout);
    return c;
  }
  bool alive() const { return process_->alive(); }
  // Its process id while it runs (to signal it); -1 once reaped.
  pid_t pid() const { return process_->pid(); }
  std::string log() const { return read_file(log_path_); }

 private:
  bool wait_until_serving(std::chrono::seconds bound) {
    static const std::regex zmq_line(R"(zmq door: listening on (tcp://127\.0\.0\.1:[0-9]+))");
    static const std::regex http_line(R"(HTTP API on http://[^ :]+:([0-9]+)/v1)");
    static const std::regex admin_line(R"(admin door on 127\.0\.0\.1:([0-9]+))");
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (int i = 0; i < 4500 && process_->alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      const std::string text = log();
      std::smatch m;
      if (endpoint_.empty() && std::regex_search(text, m, zmq_line)) endpoint_ = m[1];
      if (http_port_ == 0 && std::regex_search(text, m, http_line)) http_port_ = std::stoi(m[1]);
      if (admin_port_ == 0 && std::regex_search(text, m, admin_line)) admin_port_ = std::stoi(m[1]);
      if (!endpoint_.empty() && http_port_ != 0) break;
      std::this_thread::sleep_for(20ms);
    }
    for (int i = 0; i < 200 && !endpoint_.empty() && process_->alive() && std::chrono::steady_clock::now() < deadline;
         ++i) {
      try {
        make_client(300ms).stats();
        return read_model_id();
      } catch (const std::exception&) {
      }
    }
    return false;
  }

  // The name HTTP requests must give as "model" (GET /v1/models).
  bool read_model_id() {
    if (http_port_ == 0) return false;
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(10, 0);
    const auto res = c.Get("/v1/models");
    if (!res || res->status != 200) return false;
    model_id_ = nlohmann::json::parse(res->body).at("data").at(0).at("id").get<std::string>();
    return true;
  }

  fs::path log_path_;
  std::string endpoint_;
  int http_port_ = 0;
  int admin_port_ = 0;
  std::string model_id_;
  std::optional<child_process> process_;
};

// One request of a mix: over ZeroMQ or HTTP (/v1/completions), streamed or not.
struct mixed_request {
  generate_request request;
  bool http = false;
};

// What came back. Over HTTP there are no token ids; `error` is empty when it completed.
struct outcome {
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;
  int prompt_tokens = -1;
  int completion_tokens = -1;
  int num_deltas = 0;
  std::string error;
};

inline std::ostream& operator<<(std::ostream& os, const outcome& o) {
  return os << "{text '" << o.text << "', " << o.token_ids.size() << " ids, finish " << o.finish_reason << ", usage "
            << o.prompt_tokens << "+" << o.completion_tokens << ", error '" << o.error << "'}";
}

// The same output: text, token ids, finish reason and usage counts.
inline bool same_output(const outcome& a, const outcome& b) {
  return a.error.empty() && b.error.empty() && a.text == b.text && a.token_ids == b.token_ids &&
         a.finish_reason == b.finish_reason && a.prompt_tokens == b.prompt_tokens &&
         a.completion_tokens == b.completion_tokens;
}

// A mix over `prompts`: greedy and seeded (temperature 0.8), streamed and not, ZeroMQ and HTTP
// (when `with_http`), max_tokens between min_tokens and max_tokens. Deterministic in `seed`.
inline std::vector<mixed_request> request_mix(int count, const std::vector<std::string>& prompts, int min_tokens,
                                              int max_tokens, bool with_http, uint64_t seed) {
  std::vector<mixed_request> mix;
  for (int i = 0; i < count; ++i) {
    mixed_request m;
    m.request.prompt = prompts[static_cast<size_t>(i) % prompts.size()];
    m.request.sampling.max_tokens = min_tokens + static_cast<int>((seed + 7u * static_cast<uint64_t>(i)) %
                                                                  static_cast<uint64_t>(max_tokens - min_tokens + 1));
    if (i % 3 == 2) {
      m.request.sampling.temperature = 0.8f;
      m.request.sampling.seed = seed * 1000u + static_cast<uint64_t>(i);
    } else {
      m.request.sampling.temperature = 0.0f;
    }
    m.request.stream = i % 2 == 0;
    m.http = with_http && i % 4 >= 2;
    mix.push_back(std::move(m));
  }
  return mix;
}

inline outcome run_over_zmq(const controller_process& server, const generate_request& request,
                            std::chrono::milliseconds timeout) {
  outcome o;
  try {
    client c = server.make_client(timeout);
    const completion done = c.generate(request, [&](const delta_reply&) { ++o.num_deltas; });
    o.text = done.text;
    o.token_ids = done.token_ids;
    o.finish_reason = done.finish_reason;
    o.prompt_tokens = done.usage.prompt_tokens;
    o.completion_tokens = done.usage.completion_tokens;
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

// POST /v1/completions; a streamed answer is read as server-sent events, its text the
// concatenation of every chunk's, its usage from the final chunk (stream_options.include_usage).
inline outcome run_over_http(const controller_process& server, const generate_request& request,
                             std::chrono::milliseconds timeout) {
  outcome o;
  nlohmann::json body = {{"model", server.model_id()},
                         {"prompt", *request.prompt},
                         {"max_tokens", request.sampling.max_tokens},
                         {"temperature", request.sampling.temperature},
                         {"stream", request.stream}};
  if (request.sampling.seed) body["seed"] = *request.sampling.seed;
  if (!request.sampling.logits_plugins.empty()) body["plugins"] = request.sampling.logits_plugins;
  if (request.sampling.num_speculative_tokens >= 0)
    body["num_speculative_tokens"] = request.sampling.num_speculative_tokens;
  if (request.stream) body["stream_options"] = {{"include_usage", true}};
  httplib::Client c("127.0.0.1", server.http_port());
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout).count();
  c.set_read_timeout(seconds, 0);
  c.set_write_timeout(seconds, 0);
  const auto res = c.Post("/v1/completions", body.dump(), "application/json");
  if (!res) {
    o.error = "HTTP: " + httplib::to_string(res.error());
    return o;
  }
  if (res->status != 200) {
    o.error = "HTTP " + std::to_string(res->status) + ": " + res->body;
    return o;
  }
  try {
    auto read_usage = [&](const nlohmann::json& usage) {
      o.prompt_tokens = usage.at("prompt_tokens").get<int>();
      o.completion_tokens = usage.at("completion_tokens").get<int>();
    };
    if (!request.stream) {
      const auto answer = nlohmann::json::parse(res->body);
      o.text = answer.at("choices").at(0).at("text").get<std::string>();
      o.finish_reason = answer.at("choices").at(0).at("finish_reason").get<std::string>();
      read_usage(answer.at("usage"));
      return o;
    }
    std::istringstream events(res->body);
    for (std::string line; std::getline(events, line);) {
      if (line.rfind("data: ", 0) != 0) continue;
      const std::string data = line.substr(6);
      if (data == "[DONE]") break;
      const auto chunk = nlohmann::json::parse(data);
      if (const auto& u = chunk.at("usage"); !u.is_null()) read_usage(u);
      for (const auto& choice : chunk.at("choices")) {
        ++o.num_deltas;
        o.text += choice.at("text").get<std::string>();
        if (!choice.at("finish_reason").is_null()) o.finish_reason = choice.at("finish_reason").get<std::string>();
      }
    }
  } catch (const std::exception& e) {
    o.error = std::string("HTTP answer unreadable: ") + e.what() + ": " + res->body;
  }
  return o;
}

inline outcome run_one(const controller_process& server, const mixed_request& m, std::chrono::milliseconds timeout) {
  return m.http ? run_over_http(server, m.request, timeout) : run_over_zmq(server, m.request, timeout);
}

// Sends requests [first, first + count) of `mix` together, one thread each, into `out`.
inline std::vector<std::thread> send_together(const controller_process& server, const std::vector<mixed_request>& mix,
                                              size_t first, size_t count, std::vector<outcome>& out,
                                              std::chrono::milliseconds timeout = 60s) {
  std::vector<std::thread> threads;
  for (size_t i = first; i < first + count && i < mix.size(); ++i) {
    threads.emplace_back([&server, &mix, &out, i, timeout] { out[i] = run_one(server, mix[i], timeout); });
  }
  return threads;
}

// The reference outputs of `mix`, all at once on `reference` (a colocated server nothing kills):
// what a failover test's requests must still produce. Every one must succeed there.
inline std::vector<outcome> reference_outcomes(const controller_process& reference,
                                               const std::vector<mixed_request>& mix) {
  std::vector<outcome> out(mix.size());
  auto threads = send_together(reference, mix, 0, mix.size(), out);
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].error, "") << "reference " << i;
  return out;
}

// The whole mix in waves of `wave` concurrent requests.
inline std::vector<outcome> run_in_waves(const controller_process& server, const std::vector<mixed_request>& mix,
                                         size_t wave) {
  std::vector<outcome> out(mix.size());
  for (size_t first = 0; first < mix.size(); first += wave) {
    auto threads = send_together(server, mix, first, wave, out);
    for (auto& t : threads) t.join();
  }
  return out;
}

// The ZeroMQ stats once the server is idle: no request held anywhere, every KV block free.
inline stats_reply wait_until_idle(const controller_process& server, std::chrono::milliseconds within = 20s) {
  client c = server.make_client(5s);
  const auto deadline = std::chrono::steady_clock::now() + within;
  stats_reply s = c.stats();
  for (int i = 0; i < 2000 &&
                  (s.num_running != 0 || s.num_waiting != 0 || s.num_free_blocks != s.num_total_blocks ||
                   s.num_requests_in_flight != 0 || s.num_waiting_for_kv != 0 || s.num_kv_leases != 0) &&
                  std::chrono::steady_clock::now() < deadline;
       ++i) {
    std::this_thread::sleep_for(10ms);
    s = c.stats();
  }
  return s;
}

// After a failover trial: the server ends idle (a bounded wait) holding nothing: no request
// running, waiting or in flight, every KV block free, no reservation or transfer open.
inline void expect_nothing_held(const controller_process& server) {
  const stats_reply idle = wait_until_idle(server);
  EXPECT_EQ(idle.num_running, 0) << "requests still running after the trial";
  EXPECT_EQ(idle.num_waiting, 0) << "requests still waiting after the trial";
  EXPECT_EQ(idle.num_requests_in_flight, 0) << "requests still held after the trial";
  EXPECT_GT(idle.num_total_blocks, 0);
  EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks) << "KV blocks held after the trial";
  EXPECT_EQ(idle.num_waiting_for_kv, 0) << "a reservation left after the trial";
  EXPECT_EQ(idle.num_kv_leases, 0) << "a KV transfer left open after the trial";
}

// Bytes a process has written through write/send calls (its sockets and log included), from
// /proc/PID/io; -1 when gone. A node that forwarded tokens for many requests wrote far more than
// one that only heartbeated.
inline long bytes_written(pid_t pid) {
  std::istringstream io(read_file("/proc/" + std::to_string(pid) + "/io"));
  for (std::string key; io >> key;) {
    long value = 0;
    io >> value;
    if (key == "wchar:") return value;
  }
  return -1;
}

// Runs `mix` (in waves of `wave`) through `topology`, started with `troupe launch` in `dir`, and
// checks that it answers like one process: every output equals `expected`; every node of `busy`
// wrote at least its bytes meanwhile (through write(), /proc wchar: the CAF messages to the
// controller; heartbeats alone are a few hundred bytes), so a topology that quietly served
// everything on one node fails; no KV transfer had to be re-run; and once idle no instance holds
// a block, a reservation or an open transfer. The launch's log comes with any failure.
// Returns the launch's log.
inline std::string expect_launch_answers_like(const fs::path& dir, const std::string& name,
                                              const topology_spec& topology, const std::vector<mixed_request>& mix,
                                              const std::vector<outcome>& expected,
                                              const std::map<std::string, long>& busy, size_t wave) {
  SCOPED_TRACE(name);
  controller_process launch(controller_process::kind::launch, topology.write(dir / (name + ".toml")),
                            dir / (name + ".log"));
  const auto pids = launch.launched_pids();
  std::map<std::string, long> written_before;
  for (const auto& [node, bytes] : busy) {
    EXPECT_EQ(pids.count(node), 1u) << launch.log();
    if (pids.count(node) != 1) return launch.log();
    written_before[node] = bytes_written(pids.at(node));
  }
  const std::vector<outcome> got = run_in_waves(launch, mix, wave);
  int num_different = 0;
  for (size_t i = 0; i < mix.size(); ++i) {
    if (same_output(got[i], expected[i])) continue;
    if (++num_different <= 5) {
      ADD_FAILURE() << "request " << i << " (" << (mix[i].http ? "HTTP" : "ZeroMQ")
                    << (mix[i].request.stream ? ", streamed" : "")
                    << (mix[i].request.sampling.seed ? ", seeded" : ", greedy") << "): " << got[i]
                    << " != " << expected[i];
    }
  }
  EXPECT_EQ(num_different, 0) << "of " << mix.size();
  for (const auto& [node, bytes] : busy) {
    EXPECT_GE(bytes_written(pids.at(node)) - written_before[node], bytes) << node << " did not serve its share";
  }
  const stats_reply idle = wait_until_idle(launch);
  EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks) << "a KV block left taken";
  EXPECT_EQ(idle.num_waiting_for_kv, 0) << "a reservation left";
  EXPECT_EQ(idle.num_kv_leases, 0) << "a KV transfer left open";
  EXPECT_EQ(idle.num_requests_in_flight, 0);
  EXPECT_EQ(count_of(launch.log(), "lost its KV transfer"), 0) << "a KV transfer failed and was re-run";
  if (::testing::Test::HasFailure()) ADD_FAILURE() << name << " log:\n" << launch.log();
  return launch.log();
}

}  // namespace troupe::test::cluster
