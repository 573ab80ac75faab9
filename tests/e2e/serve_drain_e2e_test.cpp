// Graceful drain and operator logs through the real binary (issue 26 items 3 and 5): SIGTERM
// under load through both doors ends every stream whole or with an error and `[DONE]`, refuses
// new requests at once (HTTP 503 with Retry-After, ZeroMQ `unavailable`), and exits 0; with a
// drain long enough every running stream completes. With --log-format json every log line
// parses, and each request has one access line with its token counts and finish reason.

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <atomic>
#include <functional>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

struct http_answer {
  int status = 0;       // 0: no answer
  std::string headers;  // the status line and headers
  std::string body;     // as sent (a stream keeps its chunk sizes: only substrings are looked at)
  bool first_data = false;
};

// One HTTP/1.1 request on its own connection, read to the server's close; `first_data` is
// fulfilled once a streamed `data:` line (or any body) has come. Bounded by `within`.
http_answer http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                         std::promise<void>* first_data = nullptr, std::chrono::seconds within = 60s) {
  http_answer answer;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return answer;
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool told = false;
  auto tell = [&] {
    if (first_data && !told) first_data->set_value();
    told = true;
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                                "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                "\r\n\r\n" + body;
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string all;
    const auto deadline = std::chrono::steady_clock::now() + within;
    char buffer[8192];
    while (std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        break;
      }
      all.append(buffer, static_cast<size_t>(n));
      const size_t end = all.find("\r\n\r\n");
      if (end != std::string::npos && all.size() > end + 4) tell();
    }
    const size_t end = all.find("\r\n\r\n");
    answer.headers = all.substr(0, end);
    if (end != std::string::npos) answer.body = all.substr(end + 4);
    if (all.rfind("HTTP/1.1 ", 0) == 0) answer.status = std::stoi(all.substr(9, 3));
  }
  ::close(fd);
  tell();  // never leave a waiter hanging
  return answer;
}

json completion_body(int max_tokens, bool stream) {
  return {{"model", stories_dir}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
          {"temperature", 0},     {"ignore_eos", true},           {"stream", stream}};
}

// How a stream ended: whole (its last choice chunk says finish_reason and `[DONE]` follows), or
// with an error event and `[DONE]`, or refused before it began (an error status and JSON body).
enum class stream_end { whole, error_event, refused, cut };

stream_end classify(const http_answer& a) {
  if (a.status == 200) {
    const size_t done = a.body.find("data: [DONE]");
    if (done == std::string::npos) return stream_end::cut;
    if (a.body.find("data: {\"error\"") != std::string::npos) return stream_end::error_event;
    if (a.body.find("\"finish_reason\":\"length\"") != std::string::npos) return stream_end::whole;
    return stream_end::cut;
  }
  if (a.status >= 500 && json::parse(a.body, nullptr, false).contains("error")) return stream_end::refused;
  return stream_end::cut;
}

// Waits until the process has exited (bounded); false while it still runs.
bool wait_for_exit(const serve_process& server, std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (server.alive() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  return !server.alive();
}

struct load_result {
  std::vector<http_answer> http;
  std::vector<std::string> zmq;  // "whole N tokens", "error <code>: ...", or what went wrong
};

// `num_each` streaming requests through each door, each for `max_tokens` tokens; SIGTERM once
// `num_started` of them have streamed their first piece (the rest run or wait in the queue);
// `then` (e.g. a second signal); then a late request through each door, which must be refused.
// Returns how each request ended.
template <class server_process>
load_result sigterm_under_load(server_process& server, int num_each, int max_tokens, int num_started,
                               const std::function<void()>& then = {}) {
  const int port = server.http_port();
  std::atomic<int> started{0};
  std::vector<std::promise<void>> first_data(static_cast<size_t>(num_each));
  std::vector<std::future<http_answer>> http;
  std::vector<std::future<std::string>> zmq;
  for (int i = 0; i < num_each; ++i) {
    http.push_back(std::async(std::launch::async, [&, i] {
      std::promise<void>& first = first_data[static_cast<size_t>(i)];
      std::thread counter([&] {
        if (first.get_future().wait_for(120s) == std::future_status::ready) ++started;
      });
      http_answer a = http_request(port, "POST", "/v1/completions", completion_body(max_tokens, true).dump(), &first);
      counter.join();
      return a;
    }));
    zmq.push_back(std::async(std::launch::async, [&]() -> std::string {
      bool told = false;
      client c = server.make_client();
      c.set_timeout(30s);
      generate_request r = greedy("Once upon a time", max_tokens);
      r.sampling.ignore_eos = true;
      try {
        troupe::completion done = c.generate(r, [&](const delta_reply& d) {
          if (!told && !d.token_ids.empty()) ++started;
          told = told || !d.token_ids.empty();
        });
        return "whole " + std::to_string(done.token_ids.size()) + " tokens";
      } catch (const client_error& e) {
        return std::string("error ") + error_code_name(e.code()) + ": " + e.what();
      } catch (const std::exception& e) {
        return std::string("failed: ") + e.what();
      }
    }));
  }
  // Every request admitted (running or queued) and `num_started` of them streaming: a request
  // sent after the signal would be refused, which is not what is looked at here.
  client watcher = server.make_client();
  watcher.set_timeout(5s);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  int num_held = 0;
  while ((started < num_started || num_held < 2 * num_each) && std::chrono::steady_clock::now() < deadline) {
    try {
      num_held = watcher.stats().num_requests_in_flight;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_GE(started.load(), num_started);
  EXPECT_GE(num_held, 2 * num_each);
  ::kill(server.pid(), SIGTERM);
  if (then) then();

  // Refused at once: the drain closes admission before anything else. (After a second signal the
  // server may already be gone: then nothing is checked here.)
  http_answer health;
  for (int i = 0; i < 100 && health.status != 503 && !then; ++i) {
    health = http_request(port, "GET", "/health", "", nullptr, 5s);
    if (health.status != 503) std::this_thread::sleep_for(20ms);
  }
  if (!then) {
    EXPECT_EQ(health.status, 503) << health.body;
    EXPECT_NE(health.body.find("draining"), std::string::npos) << health.body;
    const http_answer late =
        http_request(port, "POST", "/v1/completions", completion_body(8, false).dump(), nullptr, 10s);
    EXPECT_EQ(late.status, 503) << late.headers << "\n" << late.body;
    EXPECT_NE(late.headers.find("Retry-After: "), std::string::npos) << late.headers;
    EXPECT_NE(late.body.find("draining"), std::string::npos) << late.body;
    client late_zmq = server.make_client();
    late_zmq.set_timeout(10s);
    try {
      late_zmq.generate(greedy("Once upon a time", 8));
      ADD_FAILURE() << "a ZeroMQ request after SIGTERM was served";
    } catch (const client_error& e) {
      EXPECT_EQ(e.code(), error_code::unavailable) << e.what();
      EXPECT_NE(std::string(e.what()).find("draining"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a ZeroMQ request after SIGTERM: " << e.what();
    }
  }

  load_result result;
  for (auto& f : http) result.http.push_back(f.get());
  for (auto& f : zmq) result.zmq.push_back(f.get());
  return result;
}

std::string tail_of(const std::string& text) { return text.substr(text.size() > 600 ? text.size() - 600 : 0); }

// Every request ended whole or with an error naming `why`; returns how many ended with the error.
int check_every_end(const load_result& r, int max_tokens, const std::string& why) {
  int num_errors = 0;
  for (const http_answer& a : r.http) {
    const stream_end end = classify(a);
    EXPECT_NE(end, stream_end::cut) << a.status << "\n" << tail_of(a.body);
    if (end == stream_end::error_event || end == stream_end::refused) {
      ++num_errors;
      EXPECT_NE(a.body.find(why), std::string::npos) << tail_of(a.body);
    }
  }
  for (const std::string& outcome : r.zmq) {
    const bool whole = outcome == "whole " + std::to_string(max_tokens) + " tokens";
    const bool ended = outcome.rfind("error unavailable: ", 0) == 0 && outcome.find(why) != std::string::npos;
    EXPECT_TRUE(whole || ended) << outcome;
    num_errors += ended;
  }
  return num_errors;
}

TEST(serve_drain, sigterm_with_no_drain_time_ends_running_streams_with_an_error_and_done_then_exits_0) {
  // --max-num-seqs 2: most requests wait in the queue, so the signal finds requests running and
  // waiting whatever the machine's speed; a drain of 0 s ends them all at its first look.
  serve_process server(
      {"--http-port", "0", "--drain-timeout", "0", "--max-num-seqs", "2", "--log-stats-interval", "0"});
  const load_result r = sigterm_under_load(server, 4, 400, 2);
  EXPECT_GT(check_every_end(r, 400, "drain timeout of 0 s"), 0) << "no request was running at the signal";
  ASSERT_TRUE(wait_for_exit(server, 20s)) << "still running 20 s after SIGTERM; its log:\n" << server.log();
  EXPECT_TRUE(WIFEXITED(server.exit_status()) && WEXITSTATUS(server.exit_status()) == 0) << server.exit_status();
  EXPECT_NE(server.log().find("ended"), std::string::npos) << server.log();
}

TEST(serve_drain, a_drain_long_enough_lets_every_running_stream_complete_whole) {
  serve_process server(
      {"--http-port", "0", "--drain-timeout", "60", "--max-num-seqs", "2", "--log-stats-interval", "0"});
  const load_result r = sigterm_under_load(server, 3, 300, 2);
  EXPECT_EQ(check_every_end(r, 300, "drain"), 0);
  ASSERT_TRUE(wait_for_exit(server, 30s)) << "still running 30 s after SIGTERM; its log:\n" << server.log();
  EXPECT_TRUE(WIFEXITED(server.exit_status()) && WEXITSTATUS(server.exit_status()) == 0) << server.exit_status();
}

TEST(serve_drain, a_second_signal_ends_a_long_drain_at_once_with_the_error_events) {
  // One sequence at a time: 16 requests of 480 tokens take seconds whatever the machine.
  serve_process server(
      {"--http-port", "0", "--drain-timeout", "600", "--max-num-seqs", "1", "--log-stats-interval", "0"});
  std::chrono::steady_clock::time_point second;
  const load_result r = sigterm_under_load(server, 8, 480, 1, [&] {
    std::this_thread::sleep_for(200ms);
    second = std::chrono::steady_clock::now();
    ::kill(server.pid(), SIGINT);
  });
  EXPECT_GT(check_every_end(r, 480, "second signal"), 0);
  ASSERT_TRUE(wait_for_exit(server, 20s)) << server.log();
  EXPECT_LT(std::chrono::steady_clock::now() - second, 10s);  // not the 600 s drain
  EXPECT_TRUE(WIFEXITED(server.exit_status()) && WEXITSTATUS(server.exit_status()) == 0) << server.exit_status();
}

TEST(serve_drain, a_controller_with_its_engine_on_another_node_drains_the_same_way) {
  troupe::testing::scratch_dir dir;
  cluster::make_credentials(dir / "certs", {"controller", "engine-a"});
  cluster::node_process engine(dir / "certs", "engine-a", free_port(), dir.path());
  cluster::topology_spec spec;
  spec.credentials = dir / "certs";
  spec.nodes = {engine.entry()};
  spec.engines = {"engine-a"};
  std::ofstream(dir / "controller.toml") << spec.toml()
                                         << "[frontend]\ndrain_timeout_s = 0\nlog_stats_interval_s = 0\n";
  cluster::controller_process controller(cluster::controller_process::kind::serve, dir / "controller.toml",
                                         dir / "controller.log");
  const load_result r = sigterm_under_load(controller, 4, 480, 2);
  EXPECT_GT(check_every_end(r, 480, "drain timeout of 0 s"), 0) << "no request was running at the signal";
  const int status = controller.wait_for_exit(20s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << controller.log();
  EXPECT_TRUE(engine.alive());  // the node stays, for the next controller
}

// Every line of the server's log as JSON (it throws on one that is not).
std::vector<json> json_lines(const std::string& log) {
  std::vector<json> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json parsed = json::parse(line, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << "not a JSON object: " << line;
    if (parsed.is_object()) lines.push_back(std::move(parsed));
  }
  return lines;
}

TEST(serve_logs, json_log_format_gives_one_parsed_access_line_per_request_and_throughput_lines) {
  serve_process server({"--http-port", "0", "--log-format", "json", "--log-stats-interval", "1"});
  const int port = server.http_port();
  for (int max_tokens : {5, 7, 9}) {
    const http_answer a =
        http_request(port, "POST", "/v1/completions", completion_body(max_tokens, max_tokens == 7).dump());
    ASSERT_EQ(a.status, 200) << a.body;
  }
  client c = server.make_client();
  for (int max_tokens : {4, 6}) {
    generate_request r = greedy("Once upon a time", max_tokens);
    r.sampling.ignore_eos = true;
    ASSERT_EQ(c.generate(r).token_ids.size(), static_cast<size_t>(max_tokens));
  }
  // One request that fails (a prompt longer than the context): its access line says so.
  std::string long_text;
  for (int i = 0; i < 600; ++i) long_text += " Once";
  generate_request too_long = greedy(long_text, 4);  // the tokenizer stage refuses it
  EXPECT_THROW(c.generate(too_long), client_error);
  // The throughput line of the busy second comes within the next tick or two.
  for (int i = 0; i < 60 && server.log().find("\"event\":\"throughput\"") == std::string::npos; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  ::kill(server.pid(), SIGTERM);
  ASSERT_TRUE(wait_for_exit(server, 20s)) << server.log();

  const std::vector<json> lines = json_lines(server.log());
  ASSERT_GT(lines.size(), 5u);
  std::multiset<std::pair<std::string, int>> access;  // (door, output tokens) of finished requests
  int num_failed = 0, num_throughput = 0;
  for (const json& line : lines) {
    EXPECT_TRUE(line.contains("time") && line.contains("level")) << line.dump();
    if (line.value("event", "") == "throughput") {
      ++num_throughput;
      EXPECT_GT(line["generation_tokens_per_s"].get<double>() + line["prompt_tokens_per_s"].get<double>(), 0)
          << line.dump();
      EXPECT_TRUE(line.contains("kv_used_percent")) << line.dump();
    }
    if (line.value("event", "") != "access") continue;
    EXPECT_EQ(line["msg"].get<std::string>().rfind("request ", 0), 0u) << line.dump();
    if (line["finish"] == "error") {
      ++num_failed;
      EXPECT_NE(line["error"].get<std::string>().find("prompt_too_long"), std::string::npos) << line.dump();
      continue;
    }
    EXPECT_EQ(line["finish"], "length") << line.dump();
    EXPECT_GT(line["prompt_tokens"].get<int>(), 0) << line.dump();
    EXPECT_GE(line["ttft_ms"].get<double>(), 0) << line.dump();
    EXPECT_GE(line["total_ms"].get<double>(), line["ttft_ms"].get<double>()) << line.dump();
    EXPECT_EQ(line["instance"], 0) << line.dump();
    access.insert({line["door"].get<std::string>(), line["output_tokens"].get<int>()});
  }
  const std::multiset<std::pair<std::string, int>> expected = {
      {"http", 5}, {"http", 7}, {"http", 9}, {"zmq", 4}, {"zmq", 6}};
  EXPECT_EQ(access, expected);
  EXPECT_EQ(num_failed, 1);
  EXPECT_GE(num_throughput, 1);
}

TEST(serve_logs, a_request_refused_at_either_door_gets_an_access_line_too) {
  serve_process server({"--http-port", "0", "--log-format", "json"}, "the-key");
  // Over ZeroMQ with a wrong key, over HTTP with none: both refused before admission.
  client wrong(server.endpoint(), "not-the-key");
  wrong.set_timeout(10s);
  generate_request r = greedy("Once upon a time", 4);
  r.id = "mine-1";
  EXPECT_THROW(wrong.generate(r), client_error);
  const http_answer a = http_request(server.http_port(), "POST", "/v1/completions", completion_body(4, false).dump());
  EXPECT_EQ(a.status, 401) << a.body;
  // One that is served, for contrast: a "request" line, not a "refused" one.
  client c = server.make_client();
  ASSERT_EQ(c.generate(greedy("Once upon a time", 4)).token_ids.size(), 4u);
  std::vector<json> refused;
  int num_served = 0;
  for (int i = 0; i < 50 && (refused.size() < 2 || num_served < 1); ++i) {
    refused.clear();
    num_served = 0;
    std::this_thread::sleep_for(100ms);
    for (const json& line : json_lines(server.log())) {
      if (line.value("event", "") != "access") continue;
      if (line.value("finish", "") == "refused") {
        refused.push_back(line);
      } else {
        ++num_served;
      }
    }
  }
  ASSERT_EQ(refused.size(), 2u) << server.log();
  EXPECT_EQ(num_served, 1) << server.log();
  const json& zmq = refused[0]["door"] == "zmq" ? refused[0] : refused[1];
  const json& http = refused[0]["door"] == "zmq" ? refused[1] : refused[0];
  EXPECT_EQ(zmq["code"], "unauthorized") << zmq.dump();
  EXPECT_EQ(zmq["client_id"], "mine-1") << zmq.dump();
  EXPECT_EQ(zmq["msg"].get<std::string>().rfind("refused door=zmq code=unauthorized", 0), 0u) << zmq.dump();
  EXPECT_EQ(http["http_status"], 401) << http.dump();
  EXPECT_EQ(http["path"], "/v1/completions") << http.dump();
  EXPECT_NE(http["error"].get<std::string>().find("missing API key"), std::string::npos) << http.dump();
}

TEST(serve_logs, no_access_log_and_a_zero_stats_interval_turn_both_lines_off) {
  serve_process server({"--no-access-log", "--log-stats-interval", "0"});
  client c = server.make_client();
  ASSERT_EQ(c.generate(greedy("Once upon a time", 4)).token_ids.size(), 4u);
  std::this_thread::sleep_for(300ms);
  const std::string log = server.log();
  EXPECT_EQ(log.find("[access]"), std::string::npos) << log;
  EXPECT_EQ(log.find("[throughput]"), std::string::npos) << log;
  EXPECT_NE(log.find("serving: ZeroMQ"), std::string::npos) << log;  // text lines as before
}

}  // namespace
}  // namespace troupe::test
