// tools/bench (build/bin/troupe-bench) end to end: against its fake server, whose delays and
// capacity are known, it must report the injected TTFT and TPOT within 5 % over both protocols
// and find the goodput of the known capacity within 10 %; its workloads must send the lengths
// asked for; --sweep must restart a server per value and write its CSV and plots; and against the
// real `troupe serve` on stories260K a short run over each protocol must come back sane.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const fs::path bench_binary = fs::path(TROUPE_BINARY_DIR) / "bin" / "troupe-bench";

fs::path scratch_path(const std::string& name) {
  static std::atomic<int> num{0};
  return fs::temp_directory_path() /
         ("troupe_bench_e2e_" + std::to_string(::getpid()) + "_" + std::to_string(num++) + "_" + name);
}

// The fake server on ports of its own, stopped when the test ends, also on a failed assertion.
class fake_server {
 public:
  fake_server(double ttft_ms, double tpot_ms, int max_concurrency)
      : zmq_port_(free_port()), http_port_(free_port()), log_(scratch_path("fake.log")) {
    process_.emplace(
        std::vector<std::string>{bench_binary.string(), "--fake-server", "--zmq-endpoint", endpoint(), "--http-port",
                                 std::to_string(http_port_), "--ttft-ms", std::to_string(ttft_ms), "--tpot-ms",
                                 std::to_string(tpot_ms), "--max-concurrency", std::to_string(max_concurrency)},
        log_);
    for (int i = 0; i < 200 && process_->alive(); ++i) {
      if (read_file(log_).find("fake server: ready") != std::string::npos) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    throw std::runtime_error("the fake server did not come up: " + read_file(log_));
  }
  ~fake_server() {
    process_.reset();
    std::error_code ignored;
    fs::remove(log_, ignored);
  }
  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(zmq_port_); }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(http_port_); }

 private:
  uint16_t zmq_port_, http_port_;
  fs::path log_;
  std::optional<child_process> process_;
};

// Runs the bench with `args` and --json; the parsed result (and the run's output on failure).
json run_bench(const std::string& args) {
  const fs::path out = scratch_path("result.json");
  const auto r = run_command(shell_quote(bench_binary.string()) + " " + args + " --json " + shell_quote(out.string()));
  EXPECT_EQ(r.exit_code, 0) << args << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err;
  json result = fs::exists(out) ? json::parse(read_file(out)) : json::object();
  fs::remove(out);
  return result;
}

void expect_within(double measured, double expected, double share, const std::string& what) {
  EXPECT_NEAR(measured, expected, expected * share) << what << ": measured " << measured << ", expected " << expected;
}

class bench_tool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(bench_binary)) GTEST_SKIP() << "no troupe-bench at " << bench_binary;
  }
};

// Three requests at a time on a server of four slots: nothing waits, so the client must see the
// server's own delays, plus only what the loopback and its own timing add. Medians for TTFT, ITL
// and E2E: on a machine shared by several builds one request's thread may get no core for tens of
// milliseconds, which moves a mean of 12 by more than 5 % and says nothing of the bench (a single
// ctest run at load average 10 saw a mean TTFT of 105.5 ms); TPOT is per request over 15 gaps.
void check_reported_delays(const std::string& target) {
  const json result = run_bench(target + " --num-prompts 12 --input-len 16 --output-len 16 --concurrency 3");
  ASSERT_TRUE(result.contains("summary")) << result.dump();
  const json& s = result["summary"];
  EXPECT_EQ(s["num_completed"], 12);
  EXPECT_EQ(s["num_errors"], 0) << s["errors"].dump();
  EXPECT_EQ(s["total_output_tokens"], 12 * 16);
  expect_within(s["ttft"]["median_ms"], 100.0, 0.05, "median TTFT");
  expect_within(s["tpot"]["median_ms"], 20.0, 0.05, "median TPOT");
  expect_within(s["tpot"]["mean_ms"], 20.0, 0.05, "mean TPOT");
  expect_within(s["itl"]["median_ms"], 20.0, 0.05, "median ITL");
  // E2E = TTFT + 15 TPOT.
  expect_within(s["e2e"]["median_ms"], 100.0 + 15 * 20.0, 0.05, "median E2E");
  ASSERT_EQ(result["requests"].size(), 12u);
  for (const auto& r : result["requests"]) EXPECT_EQ(r["itl_s"].size(), 15u) << r.dump();
}

TEST_F(bench_tool, reports_the_injected_ttft_and_tpot_over_zeromq) {
  fake_server server(100, 20, 4);
  check_reported_delays("--backend troupe-zmq --endpoint " + server.endpoint());
}

TEST_F(bench_tool, reports_the_injected_ttft_and_tpot_over_openai_http) {
  fake_server server(100, 20, 4);
  check_reported_delays("--backend openai --base-url " + server.base_url() + "/v1");
  check_reported_delays("--backend openai --chat --base-url " + server.base_url());
}

// Two slots, each request holding one for ttft + (n - 1) tpot = 50 + 9 * 10 = 140 ms: the server
// completes at most 2 / 0.14 = 14.3 requests/s. Arrivals are nearly even (gamma shape 1000), so
// below that rate no request waits (TTFT 50 ms, within the 100 ms target), and above it request i
// waits about i (1/capacity - 1/rate): with 40 requests, 90 % of them keep within the 50 ms of
// slack only while 36 (1/capacity - 1/rate) <= 50 ms, i.e. up to 1.02 x capacity. TPOT (10 ms)
// is within its 15 ms target at any rate. So the goodput is the capacity, 14.3 requests/s. (The
// slack is wide so that a loaded machine's late wake-ups below capacity are not misses.)
TEST_F(bench_tool, finds_the_goodput_of_a_server_of_known_capacity) {
  fake_server server(50, 10, 2);
  const double capacity = 2 / (0.050 + 9 * 0.010);
  const json result =
      run_bench("--backend troupe-zmq --endpoint " + server.endpoint() +
                " --num-prompts 40 --input-len 8 --output-len 10 --burstiness 1000"
                " --slo ttft=100ms,tpot=15ms --find-goodput --goodput-start-rate 8 --goodput-max-runs 10");
  ASSERT_TRUE(result.contains("goodput")) << result.dump();
  const json& g = result["goodput"];
  ASSERT_TRUE(g["goodput_rate"].is_number()) << g.dump();
  EXPECT_TRUE(g["bracketed"].get<bool>()) << g.dump();
  EXPECT_LE(g["probes"].size(), 10u);
  expect_within(g["goodput_rate"], capacity, 0.10, "goodput (requests/s)");
}

// A ShareGPT file: each gpt turn's words * 4 / 3 are the output lengths the server is asked for
// (the fake server sends exactly max_tokens); entries that are not human-then-gpt are skipped.
TEST_F(bench_tool, sends_sharegpt_prompts_with_the_answers_lengths) {
  fake_server server(1, 1, 8);
  const fs::path file = scratch_path("sharegpt.json");
  json data = json::array();
  data.push_back({{"conversations", {{{"from", "gpt"}, {"value", "starts with the model: skipped"}}}}});
  int expected_output = 0;
  for (int i = 0; i < 6; ++i) {
    std::string answer;
    for (int w = 0; w < 6 + 3 * i; ++w) answer += "word ";
    expected_output += (6 + 3 * i) * 4 / 3;
    data.push_back({{"id", std::to_string(i)},
                    {"conversations",
                     {{{"from", "human"}, {"value", "tell me a story number " + std::to_string(i)}},
                      {{"from", "gpt"}, {"value", answer}}}}});
  }
  std::ofstream(file) << data.dump();
  const json result =
      run_bench("--backend openai --base-url " + server.base_url() + " --dataset sharegpt --dataset-path " +
                shell_quote(file.string()) + " --num-prompts 6 --concurrency 3");
  fs::remove(file);
  ASSERT_TRUE(result.contains("summary")) << result.dump();
  EXPECT_EQ(result["summary"]["num_completed"], 6);
  EXPECT_EQ(result["summary"]["total_output_tokens"], expected_output);
  // "tell me a story number i": 6 words each, as the fake server counts them.
  EXPECT_EQ(result["summary"]["total_input_tokens"], 6 * 6);

  // Asking for more conversations than the file has is an error naming the file.
  const auto r = run_command(shell_quote(bench_binary.string()) + " --backend openai --base-url " + server.base_url() +
                             " --dataset sharegpt --dataset-path /nonexistent/sharegpt.json --num-prompts 6");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/sharegpt.json"), std::string::npos) << r.err;
}

// Shared-prefix prompts are the prefix plus each request's own tokens; lengths drawn from a
// distribution stay around their mean.
TEST_F(bench_tool, random_workloads_send_the_lengths_asked_for) {
  fake_server server(1, 1, 16);
  json result =
      run_bench("--backend troupe-zmq --endpoint " + server.endpoint() +
                " --num-prompts 12 --input-len 8 --shared-prefix-len 32 --num-prefix-groups 3 --output-len 5");
  ASSERT_TRUE(result.contains("summary")) << result.dump();
  EXPECT_EQ(result["summary"]["total_input_tokens"], 12 * (32 + 8));
  EXPECT_EQ(result["summary"]["total_output_tokens"], 12 * 5);

  result = run_bench("--backend troupe-zmq --endpoint " + server.endpoint() +
                     " --num-prompts 40 --input-len 20 --input-dist uniform --input-spread 0.5 --output-len 10"
                     " --output-dist lognormal --output-spread 0.5 --seed 7");
  ASSERT_TRUE(result.contains("requests")) << result.dump();
  std::set<int> input_lengths;
  for (const auto& r : result["requests"]) {
    const int n = r["prompt_tokens"];
    EXPECT_GE(n, 10);
    EXPECT_LE(n, 30);
    input_lengths.insert(n);
  }
  EXPECT_GT(input_lengths.size(), 5u) << "uniform lengths should vary";
  const double mean_output = result["summary"]["total_output_tokens"].get<double>() / 40;
  EXPECT_GT(mean_output, 6);
  EXPECT_LT(mean_output, 14);
}

// --sweep over a server setting: the server command is started per value with {} replaced, and
// stopped after; here the fake server's capacity, so throughput must grow with it. Two rounds,
// the second in reverse order; the CSV has every round.
TEST_F(bench_tool, sweeps_a_server_setting_across_restarts_and_writes_csv_and_plots) {
  const fs::path out = scratch_path("sweep");
  const uint16_t port = free_port();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  const std::string server_cmd = shell_quote(bench_binary.string()) + " --fake-server --zmq-endpoint " + endpoint +
                                 " --ttft-ms 20 --tpot-ms 5 --max-concurrency {}";
  const json result = run_bench("--backend troupe-zmq --endpoint " + endpoint +
                                " --num-prompts 16 --input-len 4 --output-len 5"
                                " --concurrency 4 --slo ttft=100ms,tpot=20ms --sweep max-concurrency=1,4 "
                                "--sweep-rounds 2 --warmup 2 --server-cmd " +
                                shell_quote(server_cmd) + " --out " + shell_quote(out.string()));
  ASSERT_TRUE(result.contains("sweep")) << result.dump();
  const json& runs = result["sweep"]["runs"];
  // Two rounds, the second in reverse order.
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0]["max-concurrency"], "1");
  EXPECT_EQ(runs[2]["max-concurrency"], "4");
  EXPECT_EQ(runs[3]["round"], 1);
  const double one = runs[0]["summary"]["request_throughput"];
  const double four = runs[1]["summary"]["request_throughput"];
  // Each request holds a slot 20 + 4 * 5 = 40 ms: 25 requests/s per slot.
  expect_within(one, 25.0, 0.25, "throughput with one slot");
  EXPECT_GT(four, 2.5 * one);
  const std::string csv = read_file(out / "sweep.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;
  EXPECT_EQ(csv.rfind("max-concurrency,round,offered_rate,", 0), 0u) << csv;
  for (const char* plot : {"latency_vs_throughput.svg", "tpot_vs_throughput.svg", "slo_attainment_vs_rate.svg"}) {
    const std::string svg = read_file(out / plot);
    EXPECT_NE(svg.find("<svg"), std::string::npos) << plot;
    EXPECT_NE(svg.find("<polyline"), std::string::npos) << plot;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << plot;
  }
  for (const char* plot : {"ttft_vs_max-concurrency.svg", "tpot_vs_max-concurrency.svg"}) {
    EXPECT_NE(read_file(out / plot).find("<polyline"), std::string::npos) << plot;
  }
  EXPECT_TRUE(fs::exists(out / "server-max-concurrency-1.log"));
  // --replot draws the same plots again from the CSV alone.
  const auto replot =
      run_command(shell_quote(bench_binary.string()) + " --replot " + shell_quote((out / "sweep.csv").string()) +
                  " --out " + shell_quote((out / "again").string()));
  EXPECT_EQ(replot.exit_code, 0) << replot.err;
  EXPECT_EQ(read_file(out / "again" / "sweep.csv"), csv);
  EXPECT_EQ(read_file(out / "again" / "tpot_vs_throughput.svg"), read_file(out / "tpot_vs_throughput.svg"));
  // Stopped after its run: the port is free for another server at once.
  {
    child_process again({bench_binary.string(), "--fake-server", "--zmq-endpoint", endpoint}, out / "again.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(again.alive()) << read_file(out / "again.log");
  }
  fs::remove_all(out);
}

// Requests the server refuses are counted as failed, with the server's words, and miss the SLO;
// the run still completes and reports.
TEST_F(bench_tool, counts_refused_requests_as_failures_with_the_servers_message) {
  fake_server server(1, 1, 4);
  const json result = run_bench("--backend openai --base-url " + server.base_url() +
                                " --num-prompts 4 --input-len 4 --output-len 2000000 --slo ttft=1s");
  ASSERT_TRUE(result.contains("summary")) << result.dump();
  const json& s = result["summary"];
  EXPECT_EQ(s["num_completed"], 0);
  EXPECT_EQ(s["num_errors"], 4);
  EXPECT_EQ(s["slo_attainment"], 0.0);
  ASSERT_FALSE(s["errors"].empty());
  const std::string error = s["errors"][0];
  EXPECT_NE(error.find("HTTP 400"), std::string::npos) << error;
  EXPECT_NE(error.find("max_tokens"), std::string::npos) << error;
}

TEST_F(bench_tool, refuses_bad_flags_naming_them) {
  auto run = [](const std::string& args) { return run_command(shell_quote(bench_binary.string()) + " " + args); };
  auto r = run("--slo ttft=fast --find-goodput");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("ttft=fast"), std::string::npos) << r.err;
  r = run("--find-goodput");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--slo"), std::string::npos) << r.err;
  r = run("--sweep max-num-batched-tokens=256,512");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--server-cmd"), std::string::npos) << r.err;
  r = run("--request-rate -3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("-3"), std::string::npos) << r.err;
  r = run("--backend openai --base-url https://example.com");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("https://example.com"), std::string::npos) << r.err;
}

// The real server, both doors: every request completes with every token asked for.
TEST_F(bench_tool, measures_troupe_serve_over_both_protocols) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "hf" / "config.json");
  if (!fs::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  serve_process server({"--http-port", "0"});
  const std::string common =
      " --num-prompts 8 --input-len 16 --output-len 12 --concurrency 4 --request-rate 20 --tokenizer " +
      shell_quote(stories_dir);
  json result = run_bench("--backend troupe-zmq --endpoint " + server.endpoint() + common);
  ASSERT_TRUE(result.contains("summary")) << result.dump();
  json s = result["summary"];
  EXPECT_EQ(s["num_completed"], 8);
  EXPECT_EQ(s["num_errors"], 0) << s["errors"].dump();
  EXPECT_EQ(s["total_input_tokens"], 8 * 16);   // token ids go as they are
  EXPECT_EQ(s["total_output_tokens"], 8 * 12);  // ignore_eos
  EXPECT_GT(s["ttft"]["mean_ms"].get<double>(), 0);
  EXPECT_LE(s["ttft"]["mean_ms"].get<double>(), s["e2e"]["mean_ms"].get<double>());
  EXPECT_GT(s["tpot"]["mean_ms"].get<double>(), 0);
  EXPECT_GT(s["output_throughput"].get<double>(), 0);

  for (const std::string chat : {"", " --chat"}) {
    result =
        run_bench("--backend openai --base-url http://127.0.0.1:" + std::to_string(server.http_port()) + chat + common);
    ASSERT_TRUE(result.contains("summary")) << result.dump();
    s = result["summary"];
    EXPECT_EQ(s["num_completed"], 8) << chat;
    EXPECT_EQ(s["num_errors"], 0) << chat << s["errors"].dump();
    EXPECT_EQ(s["total_output_tokens"], 8 * 12) << chat;  // the server's usage, with ignore_eos
    EXPECT_GT(s["total_input_tokens"].get<int>(), 8 * 8) << chat;
    EXPECT_GT(s["ttft"]["mean_ms"].get<double>(), 0) << chat;
    EXPECT_LE(s["ttft"]["mean_ms"].get<double>(), s["e2e"]["mean_ms"].get<double>()) << chat;
  }
  auto c = server.make_client();
  const auto idle = wait_until_idle(c);
  EXPECT_EQ(idle.num_requests_in_flight, 0);
}

}  // namespace
}  // namespace troupe::test
