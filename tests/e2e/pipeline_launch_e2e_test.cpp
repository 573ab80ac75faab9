// `troupe launch` of a pipeline topology (issue 27): [pipeline] stages placed on a [[nodes]]
// entry are started by launch as `troupe stage` children, supervised like its nodes, and the
// engine connects to them. Greedy outputs equal the colocated server's (and the references); a
// stage killed with SIGKILL under load loses no request: /health answers 503 naming the stage,
// the requests wait, launch starts the stage again, the engine's link reconnects and every
// request completes with the colocated server's tokens, recomputed from its prompt and the
// tokens it had streamed. A stage that stays down past failover_wait_ms fails them naming it.

#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "tests/e2e/e2e_support.hpp"
#include "tests/e2e/serve_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using troupe::testing::scratch_dir;

bool running(pid_t pid) {
  const std::string text = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// `troupe launch FILE` with an HTTP port, its log in a file; SIGTERM (then SIGKILL) at the end.
class pipeline_launch {
 public:
  pipeline_launch(const fs::path& topology, const fs::path& log, uint16_t http_port)
      : log_path_(log),
        http_port_(http_port),
        process_({troupe_binary.string(), "launch", topology.string(), "--zmq-endpoint", "tcp://127.0.0.1:*",
                  "--http-port", std::to_string(http_port), "--log-level", "info"},
                 log) {}

  // Waits (bounded) until the stage logged that it listens and the controller's door is up.
  bool wait_until_serving() {
    static const std::regex zmq_line(R"(zmq door: listening on (tcp://127\.0\.0\.1:[0-9]+))");
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    for (int i = 0; i < 4500 && process_.alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      const std::string text = log();
      std::smatch m;
      if (std::regex_search(text, m, zmq_line) && text.find("stage-a | ") != std::string::npos &&
          text.find("pipeline stage 0-1 listening on") != std::string::npos) {
        endpoint_ = m[1];
        return true;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  // The pids launch logged for `name` (`started NAME (pid N)`), oldest first.
  std::vector<pid_t> pids_of(const std::string& name) const {
    static const std::regex started(R"(started ([A-Za-z0-9._-]+) \(pid ([0-9]+)\))");
    std::vector<pid_t> pids;
    const std::string text = log();
    for (std::sregex_iterator i(text.begin(), text.end(), started), end; i != end; ++i) {
      if ((*i)[1] == name) pids.push_back(static_cast<pid_t>(std::stoi((*i)[2])));
    }
    return pids;
  }

  // GET /health: its status and body (status 0 when it did not answer).
  std::pair<int, std::string> health() const {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(5, 0);
    auto res = c.Get("/health");
    return res ? std::make_pair(res->status, res->body) : std::make_pair(0, std::string("no answer"));
  }

  // GET /metrics: its body ("" when it did not answer).
  std::string metrics() const {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(5, 0);
    auto res = c.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  }

  // Polls /health (bounded) until it answers `status`; the last answer.
  std::pair<int, std::string> wait_for_health(int status, std::chrono::seconds bound) const {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    std::pair<int, std::string> answer = health();
    for (int i = 0; i < 3000 && answer.first != status && std::chrono::steady_clock::now() < deadline; ++i) {
      std::this_thread::sleep_for(20ms);
      answer = health();
    }
    return answer;
  }

  int stop_with_sigterm() {
    ::kill(process_.pid(), SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (int i = 0; i < 1500 && process_.alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      std::this_thread::sleep_for(20ms);
    }
    return process_.alive() ? -1 : process_.exit_status();
  }

  client make_client() const {
    client c(endpoint_);
    c.set_timeout(60s);  // generous: 2 cores shared with builds
    return c;
  }
  std::string log() const { return read_file(log_path_); }

 private:
  fs::path log_path_;
  uint16_t http_port_;
  child_process process_;  // stopped (SIGTERM, then SIGKILL) when the test ends, also on failure
  std::string endpoint_;
};

std::vector<generate_request> requests() {
  std::vector<generate_request> all;
  for (const auto& ref : stories_references()) {
    all.push_back(greedy(ref.at("prompt").get<std::string>(), ref.at("max_new_tokens").get<int>()));
  }
  const char* prompts[] = {"Once upon a time there was", "The cat", "Lily wanted", "Tom and Sue went to the park"};
  for (int i = 0; i < 4; ++i) all.push_back(greedy(prompts[i], 20 + 7 * i));
  return all;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<completion>& outputs) {
  std::vector<std::vector<int32_t>> tokens;
  for (const completion& c : outputs) tokens.push_back(c.token_ids);
  return tokens;
}

// Each request from its own thread, all at once; a failure is a test failure naming it.
std::vector<completion> launch_together(const pipeline_launch& launch, const std::vector<generate_request>& all) {
  std::vector<completion> outputs(all.size());
  std::vector<std::string> errors(all.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < all.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        outputs[i] = launch.make_client().generate(all[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "request " << i;
  return outputs;
}

class pipeline_launch_e2e : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json"); }

  // stories260K's layers 0-1 on node stage-a (a `troupe stage` launch starts), 2-4 on the controller;
  // more keys of the node and of [pipeline] as given.
  fs::path write_topology(const std::string& node_keys = "", const std::string& pipeline_keys = "") const {
    const fs::path path = dir_.path() / "pipeline.toml";
    std::ofstream(path) << "[model]\npath = \"" << stories_dir << "\"\n"
                        << "[node]\nthreads = 1\n"
                        << "[[nodes]]\nname = \"stage-a\"\naddress = \"127.0.0.1:" << free_port() << "\"\n"
                        << node_keys << "[pipeline]\nstages = [{ node = \"stage-a\", layers = \"0-1\" }]\n"
                        << pipeline_keys;
    return path;
  }

  scratch_dir dir_;
};

TEST_F(pipeline_launch_e2e, launch_starts_the_stage_and_answers_like_the_colocated_server) {
  std::vector<std::vector<int32_t>> expected;
  {
    serve_process colocated({});
    expected = tokens_of(serve_together(colocated, requests()));
  }
  pipeline_launch launch(write_topology(), dir_.path() / "launch.log", free_port());
  ASSERT_TRUE(launch.wait_until_serving()) << launch.log();
  const std::vector<pid_t> stage = launch.pids_of("stage-a");
  ASSERT_EQ(stage.size(), 1u) << launch.log();
  const std::vector<completion> outputs = launch_together(launch, requests());
  EXPECT_EQ(tokens_of(outputs), expected);
  const auto refs = stories_references();
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(outputs[i].text, refs[i].at("completion").get<std::string>()) << refs[i].at("prompt");
  }
  EXPECT_NE(launch.log().find("pipeline of 2 stages (layers 0-1 at kvtcp://127.0.0.1:"), std::string::npos)
      << launch.log();
  EXPECT_EQ(launch.wait_for_health(200, 30s).first, 200);  // the HTTP door may come up after the ZeroMQ one
  const int status = launch.stop_with_sigterm();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                                             << launch.log();
  EXPECT_FALSE(running(stage[0])) << "the stage outlived launch";
}

// [pipeline] nodes: launch weighs the model, cuts it into a stage per node and the controller's
// (layers 0-1 and 2-3 on the nodes, 4 and the head here, the split of least largest stage),
// starts both stages, and answers like the colocated server.
TEST_F(pipeline_launch_e2e, nodes_split_the_model_by_bytes_and_answer_like_the_colocated_server) {
  std::vector<std::vector<int32_t>> expected;
  {
    serve_process colocated({});
    expected = tokens_of(serve_together(colocated, requests()));
  }
  const fs::path path = dir_.path() / "split.toml";
  std::ofstream(path) << "[model]\npath = \"" << stories_dir << "\"\n"
                      << "[node]\nthreads = 1\n"
                      << "[[nodes]]\nname = \"stage-a\"\naddress = \"127.0.0.1:" << free_port() << "\"\n"
                      << "[[nodes]]\nname = \"stage-b\"\naddress = \"127.0.0.1:" << free_port() << "\"\n"
                      << "[pipeline]\nnodes = [\"stage-a\", \"stage-b\"]\n";
  pipeline_launch launch(path, dir_.path() / "launch.log", free_port());
  ASSERT_TRUE(launch.wait_until_serving()) << launch.log();
  const std::string log = launch.log();
  EXPECT_NE(log.find("pipeline: layers 0-1 on stage-a"), std::string::npos) << log;
  EXPECT_NE(log.find("pipeline: layers 2-3 on stage-b"), std::string::npos) << log;
  EXPECT_NE(log.find("pipeline: layers 4-4 on the controller"), std::string::npos) << log;
  EXPECT_NE(log.find("pipeline stage 2-3 listening on"), std::string::npos) << log;
  EXPECT_NE(log.find("pipeline of 3 stages (layers 0-1 at kvtcp://127.0.0.1:"), std::string::npos) << log;
  ASSERT_EQ(launch.pids_of("stage-b").size(), 1u) << log;
  EXPECT_EQ(tokens_of(launch_together(launch, requests())), expected);
  const int status = launch.stop_with_sigterm();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                                             << launch.log();
}

// `troupe scale --list` names the pipelined instance's stages, each with its busy share of the
// last 10 s: the stage's own compute time (a remote stage's from its result frames), more than
// nothing once requests ran, at most all of it.
TEST_F(pipeline_launch_e2e, scale_list_shows_each_stage_and_its_busy_share_and_metrics_its_cpu) {
  const fs::path certs = dir_.path() / "certs";
  const run_result made =
      run_troupe("certs --out " + shell_quote(certs.string()) + " --name controller --name stage-a --name admin");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string cluster =
      "[cluster]\nname = \"controller\"\ncredentials = \"" + certs.string() + "\"\nadmin_listen = \"127.0.0.1:0\"\n";
  pipeline_launch launch(write_topology(cluster), dir_.path() / "launch.log", free_port());
  ASSERT_TRUE(launch.wait_until_serving()) << launch.log();
  std::smatch m;
  const std::string log = launch.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(admin door on 127\.0\.0\.1:([0-9]+))"))) << log;
  const std::string admin_port = m[1];
  launch_together(launch, requests());

  const run_result listed = run_troupe("scale --controller 127.0.0.1:" + admin_port + " --credentials " +
                                       shell_quote(certs.string()) + " --name admin --list");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const std::regex stages(R"( stages=0-1:([0-9]+\.[0-9])%,2-4:([0-9]+\.[0-9])%$)");
  std::smatch s;
  const std::string line = listed.out.substr(0, listed.out.find('\n'));
  ASSERT_TRUE(std::regex_search(line, s, stages)) << listed.out << listed.err;
  const double remote = std::stod(s[1]), local = std::stod(s[2]);
  EXPECT_GT(remote + local, 0.0) << line;
  EXPECT_LE(remote, 100.0) << line;
  EXPECT_LE(local, 100.0) << line;

  // The stage's process is counted in /metrics beside the controller's (its result frames carry
  // its CPU), under its host and pid, with some compute since it began serving.
  const std::vector<pid_t> stage_pids = launch.pids_of("stage-a");
  ASSERT_EQ(stage_pids.size(), 1u) << launch.log();
  const std::string label = "{process=\"127.0.0.1:" + std::to_string(stage_pids[0]) + "\"}";
  const std::string metrics = launch.metrics();
  const std::regex compute(R"(troupe_node_compute_cpu_seconds_total)" +
                           std::regex_replace(label, std::regex(R"([{}.])"), R"(\$&)") + R"( ([0-9.e+-]+))");
  std::smatch c;
  ASSERT_TRUE(std::regex_search(metrics, c, compute)) << label << "\n" << metrics;
  EXPECT_GT(std::stod(c[1]), 0.0) << metrics;
  EXPECT_NE(metrics.find("troupe_node_stack_cpu_seconds_total" + label), std::string::npos) << metrics;
  const int status = launch.stop_with_sigterm();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                                             << launch.log();
}

// The load of the kill tests: long greedy requests, two prompts.
generate_request load_request(int thread) {
  return greedy(thread % 2 ? "Once upon a time" : "The dog and the cat", 400);
}

TEST_F(pipeline_launch_e2e, a_killed_stage_loses_no_request_shows_in_health_and_serves_again_once_restarted) {
  std::vector<std::vector<int32_t>> expected;
  std::vector<int32_t> expected_load[2];
  {
    serve_process colocated({});
    expected = tokens_of(serve_together(colocated, requests()));
    client c(colocated.endpoint());
    c.set_timeout(60s);
    for (int t = 0; t < 2; ++t) expected_load[t] = c.generate(load_request(t)).token_ids;
  }
  pipeline_launch launch(write_topology(), dir_.path() / "launch.log", free_port());
  ASSERT_TRUE(launch.wait_until_serving()) << launch.log();
  const std::vector<pid_t> first = launch.pids_of("stage-a");
  ASSERT_EQ(first.size(), 1u) << launch.log();
  // Warm the prefix cache with the prompts asked again after the restart.
  EXPECT_EQ(tokens_of(launch_together(launch, requests())), expected);

  // Long requests from four threads, one after another, while the stage is killed under them:
  // every one completes, each with the colocated server's tokens.
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::vector<std::string> failures;
  int num_done = 0;
  int num_wrong = 0;
  std::vector<std::thread> load;
  for (int t = 0; t < 4; ++t) {
    load.emplace_back([&, t] {
      for (int i = 0; i < 1000 && !stop; ++i) {
        try {
          const completion c = launch.make_client().generate(load_request(t));
          std::lock_guard lock(mutex);
          ++num_done;
          if (c.token_ids != expected_load[t % 2]) ++num_wrong;
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          failures.push_back(e.what());
          if (failures.size() > 20) return;
        }
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  ASSERT_EQ(::kill(first[0], SIGKILL), 0);
  const auto down = launch.wait_for_health(503, 30s);
  EXPECT_EQ(down.first, 503) << down.second << "\n" << launch.log();
  EXPECT_NE(down.second.find("pipeline stage 0-1 at kvtcp://127.0.0.1:"), std::string::npos) << down.second;

  // launch starts the stage again; the engine reconnects and /health is 200 again.
  const auto up = launch.wait_for_health(200, 60s);
  // A while more of load on the restarted stage, then the threads finish their requests.
  std::this_thread::sleep_for(1s);
  stop = true;
  for (auto& t : load) t.join();
  ASSERT_EQ(up.first, 200) << up.second << "\n" << launch.log();
  {
    std::lock_guard lock(mutex);
    for (const std::string& f : failures) ADD_FAILURE() << "a request failed across the stage's restart: " << f;
    EXPECT_EQ(num_wrong, 0) << "of " << num_done << " requests, some differ from the colocated output";
    EXPECT_GE(num_done, 4);
    std::printf("%d requests completed across the stage's kill and restart, none failed\n", num_done);
  }
  // The requests in flight were put back, not failed, and the stage's loss was noticed under load.
  EXPECT_NE(launch.log().find("running requests wait to run again from their tokens"), std::string::npos)
      << launch.log();
  const std::vector<pid_t> pids = launch.pids_of("stage-a");
  ASSERT_GE(pids.size(), 2u) << launch.log();
  EXPECT_NE(launch.log().find("restarting stage-a in"), std::string::npos) << launch.log();
  EXPECT_NE(launch.log().find("reconnected after"), std::string::npos) << launch.log();
  // Served again, with the answers of before: nothing computed before the kill is reused.
  EXPECT_EQ(tokens_of(launch_together(launch, requests())), expected);
  const int status = launch.stop_with_sigterm();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                                             << launch.log();
  EXPECT_FALSE(running(pids.back())) << "the restarted stage outlived launch";
}

TEST_F(pipeline_launch_e2e, a_stage_down_past_failover_wait_fails_its_requests_naming_it) {
  // The stage is not restarted, and requests wait for it 1.5 s.
  pipeline_launch launch(write_topology("restart = \"never\"\n", "failover_wait_ms = 1500\n"),
                         dir_.path() / "launch.log", free_port());
  ASSERT_TRUE(launch.wait_until_serving()) << launch.log();
  const std::vector<pid_t> first = launch.pids_of("stage-a");
  ASSERT_EQ(first.size(), 1u) << launch.log();
  std::mutex mutex;
  std::vector<std::string> failures;
  int num_done = 0;
  std::vector<std::thread> load;
  for (int t = 0; t < 4; ++t) {
    load.emplace_back([&, t] {
      // One request after another until one fails (the stage is killed under them).
      for (int i = 0; i < 200; ++i) {
        try {
          launch.make_client().generate(load_request(t));
          std::lock_guard lock(mutex);
          ++num_done;
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          failures.push_back(e.what());
          return;
        }
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(first[0], SIGKILL), 0);
  for (auto& t : load) t.join();
  const auto waited = std::chrono::steady_clock::now() - killed;
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(failures.size(), 4u) << num_done << " done";
    for (const std::string& f : failures) {
      EXPECT_NE(f.find("pipeline stage 0-1 at kvtcp://127.0.0.1:"), std::string::npos) << "not naming the stage: " << f;
      EXPECT_NE(f.find("failover_wait_ms (1500 ms)"), std::string::npos) << f;
    }
  }
  EXPECT_GE(waited, 1400ms) << "the requests did not wait for the stage";
  // A request sent while the stage is still down waits its own 1.5 s, then fails the same way.
  EXPECT_EQ(launch.health().first, 503);
  const auto sent = std::chrono::steady_clock::now();
  try {
    launch.make_client().generate(greedy("The cat", 8));
    ADD_FAILURE() << "a request was served with the stage down";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0-1"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - sent, 1400ms);
  launch.stop_with_sigterm();
}

}  // namespace
}  // namespace troupe::test
