// Issue 27's acceptance checks of a pipelined engine, each stage its own process:
// - the 200-request mix (prompts that share prefixes, so later ones hit the prefix cache; ZeroMQ
//   and HTTP, streamed and not) answers with the colocated server's greedy outputs through a
//   2-stage pipeline and through a 3-stage one with chunked prefill forced small, three
//   micro-batches and speculative decoding;
// - a 1P1D whose prefill and decode instances are each a 2-stage pipeline answers the mix like
//   colocated, the stages' layers of KV going from the prefill's stage to the decode's (a KV
//   channel per pair of stages: the stages hold the cluster's keys), and again with every layer
//   through the engines (kv_stage_pairs = false);
// - kill -9 of a stage at a random moment, 20 trials: every request completes with the output of
//   an undisturbed colocated server (seeded sampling too), no token lost or sent twice, the
//   engine ends each trial with every KV block free and nothing held, and the stage that was not
//   killed serves on without a restart, its memory not growing trial after trial;
// - kill -9 of one of a pipelined pair's stages, 6 trials: the same, and the pair's engines take
//   the restarted stage back.

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdlib>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/cluster_fixture.hpp"
#include "tests/e2e/stage_process.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// Prompts that share their beginnings, so that the mix's later requests find them cached.
const std::vector<std::string> prompts = {"Once upon a time",
                                          "Once upon a time there was a little girl",
                                          "The little dog",
                                          "The little dog ran to the park",
                                          "Lily and Tom went to the park",
                                          "One day, a bird"};

// Every stage and the engine keep an f32 KV cache: a request re-run after a stage's loss
// recomputes its tokens as a prompt through the tiled attention kernel where they were decoded one
// by one, which differs in the last f32 bits; an f16 cache rounds such a difference to a
// neighbouring value now and then (cluster_failover_e2e_test.cpp says the same of engine nodes).
const std::vector<std::string> stage_args = {"--kv-cache-dtype", "f32"};

// `[pipeline]` for `stages` (in order) and `extra` lines.
std::string pipeline_toml(const std::vector<const stage_process*>& stages, const std::string& extra) {
  std::string t = "[pipeline]\nstages = [";
  for (size_t i = 0; i < stages.size(); ++i) {
    t += (i ? ", " : "") + std::string("{ endpoint = \"") + stages[i]->endpoint() + "\", layers = \"" +
         stages[i]->layers() + "\" }";
  }
  return t + "]\n" + extra;
}

std::vector<mixed_request> greedy_only(std::vector<mixed_request> mix) {
  for (auto& m : mix) {
    m.request.sampling.temperature = 0.0f;
    m.request.sampling.seed.reset();
  }
  return mix;
}

int health_status(const controller_process& server) {
  httplib::Client c("127.0.0.1", server.http_port());
  c.set_read_timeout(5, 0);
  const auto res = c.Get("/health");
  return res ? res->status : -1;
}

// Resident memory of `pid` in KiB (VmRSS), or -1.
long resident_kib(pid_t pid) {
  static const std::regex vm_rss(R"(VmRSS:\s+([0-9]+) kB)");
  const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  std::smatch m;
  return std::regex_search(status, m, vm_rss) ? std::stol(m[1]) : -1;
}

void expect_same_outputs(const std::string& topology, const std::vector<outcome>& got,
                         const std::vector<outcome>& expected, const std::string& log) {
  ASSERT_EQ(got.size(), expected.size());
  int num_different = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_output(got[i], expected[i])) continue;
    if (++num_different <= 5) ADD_FAILURE() << topology << ": request " << i << ": " << got[i] << " != " << expected[i];
  }
  EXPECT_EQ(num_different, 0) << topology << ": " << num_different << " of " << got.size()
                              << " requests differ; the server's log:\n"
                              << log;
}

class pipeline_outputs_e2e : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json"); }

  std::optional<controller_process> start_server(const std::string& name, topology_spec spec) {
    spec.kv_cache_dtype = "f32";
    return std::optional<controller_process>(std::in_place, controller_process::kind::serve,
                                             spec.write(dir_ / (name + ".toml")), dir_ / (name + ".log"));
  }

  // The 200-request mix, greedy (the prompts share prefixes; ZeroMQ and HTTP, streamed and not).
  static std::vector<mixed_request> greedy_mix() { return greedy_only(request_mix(200, prompts, 8, 64, true, 5)); }

  // What a colocated server answers to `mix`, every request answered without an error.
  std::vector<outcome> colocated_outcomes(const std::vector<mixed_request>& mix) {
    auto colocated = start_server("colocated", {});
    std::vector<outcome> expected = run_in_waves(*colocated, mix, wave);
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(expected[i].error, "") << "colocated, request " << i;
    return expected;
  }

  // The kill trials' mix (8 requests of 60-160 tokens, a third seeded-sampled) and what a
  // colocated server answers to it.
  static std::vector<mixed_request> kill_mix() { return request_mix(8, prompts, 60, 160, true, 3); }
  std::vector<outcome> colocated_reference(const std::vector<mixed_request>& mix) {
    auto colocated = start_server("colocated", {});
    return reference_outcomes(*colocated, mix);
  }

  // The credentials of a pipelined pair's cluster (an admin's too), and the arguments of its
  // stages: with the cluster's keys each stage's link is curve://, and the prefill's stage sends
  // its layers' KV straight to the decode's (a KV channel per pair of stages).
  std::vector<std::string> pair_stage_args(const std::string& name) const {
    std::vector<std::string> args = stage_args;
    args.insert(args.end(), {"--credentials", (dir_.path() / "certs").string(), "--name", name});
    return args;
  }
  void make_pair_credentials() {
    make_credentials(dir_.path() / "certs", {"controller", "prefill-a", "decode-a", "admin", "stage-p", "stage-d"});
  }
  // A prefill node and a decode node (`troupe launch`, mutual TLS, f32 KV), no stages yet.
  topology_spec pair_of_nodes() const {
    topology_spec pair;
    pair.kv_cache_dtype = "f32";
    pair.credentials = dir_.path() / "certs";
    pair.nodes = {{"prefill-a", free_port()}, {"decode-a", free_port()}};
    pair.prefill = {"prefill-a"};
    pair.decode = {"decode-a"};
    pair.engines = {};
    return pair;
  }
  // A prefill/decode pair whose stages `troupe launch` starts on nodes stage-p and stage-d (mutual
  // TLS; make_pair_credentials first).
  topology_spec pipelined_pair_on_nodes(const std::string& extra) {
    topology_spec pair = pair_of_nodes();
    pair.extra_toml = "[[nodes]]\nname = \"stage-p\"\naddress = \"127.0.0.1:" + std::to_string(free_port()) +
                      "\"\n[[nodes]]\nname = \"stage-d\"\naddress = \"127.0.0.1:" + std::to_string(free_port()) +
                      "\"\n[pipeline]\nprefill_stages = [{ node = \"stage-p\", layers = \"0-1\" }]\n"
                      "decode_stages = [{ node = \"stage-d\", layers = \"0-1\" }]\n" +
                      extra;
    return pair;
  }
  // A prefill/decode pair whose instances each drive one of these stages (`troupe launch` of a
  // prefill and a decode node, mutual TLS; make_pair_credentials first).
  topology_spec pipelined_pair(const stage_process& prefill_stage, const stage_process& decode_stage,
                               const std::string& extra) {
    topology_spec pair = pair_of_nodes();
    pair.extra_toml = "[pipeline]\nprefill_stages = [{ endpoint = \"" + prefill_stage.endpoint() + "\", layers = \"" +
                      prefill_stage.layers() + "\" }]\ndecode_stages = [{ endpoint = \"" + decode_stage.endpoint() +
                      "\", layers = \"" + decode_stage.layers() + "\" }]\n" + extra;
    return pair;
  }

  // How long `mix` takes `server` undisturbed: the quicker of two rounds (the first warms it up),
  // each answering `expected`. The kill trials fall within it.
  static std::chrono::milliseconds undisturbed_mix_time(const controller_process& server,
                                                        const std::vector<mixed_request>& mix,
                                                        const std::vector<outcome>& expected) {
    auto mix_time = std::chrono::milliseconds::max();
    for (int round = 0; round < 2; ++round) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<outcome> got(mix.size());
      auto threads = send_together(server, mix, 0, mix.size(), got, 60s);
      for (auto& t : threads) t.join();
      mix_time = std::min(
          mix_time, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start));
      for (size_t i = 0; i < mix.size(); ++i) {
        EXPECT_TRUE(same_output(got[i], expected[i]))
            << "undisturbed, request " << i << ": " << got[i] << " != " << expected[i];
      }
    }
    std::printf("the mix takes %lld ms undisturbed\n", static_cast<long long>(mix_time.count()));
    return mix_time;
  }

  // One kill trial: `mix` sent to `server`, `victim` killed with SIGKILL at a random moment within
  // 3/4 of `mix_time` and started again on its port after 0-400 ms; every request must answer
  // `expected` (equal text and ids of the concatenated deltas: no token lost, none sent twice).
  static void kill_during_mix(const controller_process& server, const std::vector<mixed_request>& mix,
                              const std::vector<outcome>& expected, stage_process& victim, const std::string& name,
                              std::chrono::milliseconds mix_time, std::mt19937_64& rng) {
    const auto kill_after = std::chrono::milliseconds(
        2 + static_cast<long long>(rng() % static_cast<uint64_t>(std::max<long long>(1, mix_time.count() * 3 / 4))));
    const auto down_for = std::chrono::milliseconds(rng() % 400);
    std::vector<outcome> got(mix.size());
    auto threads = send_together(server, mix, 0, mix.size(), got, 60s);
    std::this_thread::sleep_for(kill_after);
    victim.kill9();
    std::this_thread::sleep_for(down_for);
    try {
      victim.start();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < mix.size(); ++i) {
      EXPECT_TRUE(same_output(got[i], expected[i]))
          << "request " << i << " after killing " << name << " at " << kill_after.count() << " ms, down "
          << down_for.count() << " ms: " << got[i] << " != " << expected[i];
    }
  }

  static constexpr size_t wave = 25;  // requests sent at once
  scratch_dir dir_;
};

TEST_F(pipeline_outputs_e2e, the_200_request_mix_answers_like_colocated_in_two_and_three_stages) {
  const std::vector<mixed_request> mix = greedy_mix();
  const std::vector<outcome> expected = colocated_outcomes(mix);
  ASSERT_FALSE(HasFailure());
  {
    stage_process front("0-1", stories_dir, stage_args);
    topology_spec two;
    two.extra_toml = pipeline_toml({&front}, "micro_batches = 2\n");
    auto pipelined = start_server("two-stages", two);
    expect_same_outputs("2 stages", run_in_waves(*pipelined, mix, wave), expected, pipelined->log());
  }
  {
    stage_process first("0-0", stories_dir, stage_args);
    stage_process second("1-2", stories_dir, stage_args);
    topology_spec three;
    three.max_num_batched_tokens = 16;  // every prompt of the mix in several chunks
    three.num_speculative_tokens = 2;   // n-gram drafts, verified through all three stages
    three.extra_toml = pipeline_toml({&first, &second}, "micro_batches = 3\n");
    auto pipelined = start_server("three-stages", three);
    expect_same_outputs("3 stages, chunks of 16, 3 micro-batches, 2 draft tokens", run_in_waves(*pipelined, mix, wave),
                        expected, pipelined->log());
    EXPECT_NE(pipelined->log().find("pipeline of 3 stages"), std::string::npos) << pipelined->log();
  }
}

// A prefill/decode pair whose instances are each a 2-stage pipeline (`troupe launch`: a prefill
// node and a decode node, each driving a `troupe stage` of layers 0-1): the prefill streams its
// KV layer by layer, its stage's layers fetched over the stage link, and the decode imports each
// layer into the stage holding it. The 200-request mix answers like colocated, and nothing is
// held at the end.
TEST_F(pipeline_outputs_e2e, a_1p1d_whose_prefill_and_decode_are_2_stage_pipelines_answers_like_colocated) {
  const std::vector<mixed_request> mix = greedy_mix();
  const std::vector<outcome> expected = colocated_outcomes(mix);
  ASSERT_FALSE(HasFailure());
  make_pair_credentials();
  // The stages placed on [[nodes]]: launch starts them with the cluster's credentials (curve://).
  topology_spec pair = pipelined_pair_on_nodes("micro_batches = 2\n");
  const std::string log = expect_launch_answers_like(dir_.path(), "1p1d-pipelines", pair, mix, expected,
                                                     {{"prefill-a", 8192}, {"decode-a", 32768}}, wave);
  // The controller's line for each engine instance names what its worker runs.
  int num_pipelined = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("(prefill): model") == std::string::npos && line.find("(decode): model") == std::string::npos)
      continue;
    EXPECT_NE(line.find("on pipeline of 2 stages (layers 0-1 at curve://"), std::string::npos) << line;
    ++num_pipelined;
  }
  EXPECT_EQ(num_pipelined, 2) << log;
  // Layers 0-1 of every request went from the prefill's stage to the decode's, not through the
  // engines.
  EXPECT_NE(log.find("pipeline stage 0-1: KV receiver for its layers"), std::string::npos) << log;
  EXPECT_EQ(log.find("every layer comes through this engine"), std::string::npos) << log;
  EXPECT_EQ(log.find("are not cut alike"), std::string::npos) << log;

  // The same pair with every layer through the engines (kv_stage_pairs = false), its stages
  // started by hand.
  stage_process prefill_plain("0-1", stories_dir, pair_stage_args("stage-p"));
  stage_process decode_plain("0-1", stories_dir, pair_stage_args("stage-d"));
  const topology_spec through_engines =
      pipelined_pair(prefill_plain, decode_plain, "micro_batches = 2\nkv_stage_pairs = false\n");
  expect_launch_answers_like(dir_.path(), "1p1d-pipelines-through-engines", through_engines, mix, expected,
                             {{"prefill-a", 8192}, {"decode-a", 32768}}, wave);
  EXPECT_EQ(decode_plain.log().find("KV receiver for its layers"), std::string::npos) << decode_plain.log();
}

TEST_F(pipeline_outputs_e2e, twenty_kill_9_trials_of_a_stage_lose_no_request_and_no_token) {
  const uint64_t seed = failover_seed("pipeline_outputs_e2e");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));

  const std::vector<mixed_request> mix = kill_mix();
  const std::vector<outcome> expected = colocated_reference(mix);
  ASSERT_FALSE(HasFailure());

  // Each stage on a port of the test's choosing, so a killed one comes back on the same endpoint;
  // the engine's link retries every 50-200 ms, and requests wait for it up to 30 s.
  std::deque<stage_process> stages;
  stages.emplace_back("0-0", stories_dir, stage_args, free_port());
  stages.emplace_back("1-2", stories_dir, stage_args, free_port());
  topology_spec spec;
  spec.extra_toml = pipeline_toml({&stages[0], &stages[1]},
                                  "micro_batches = 2\nreconnect_first_delay_ms = 50\nreconnect_max_delay_ms = 200\n"
                                  "failover_wait_ms = 30000\n");
  auto server = start_server("pipelined", spec);

  // Resident memory of each stage at the end of the first trial after its (re)start, and the most
  // a stage grew since while it was not killed. (The engine's own grows as its bounded rings of
  // finished requests and steps fill, thousands of requests long, so its check is the counts.)
  long stage_kib_since_start[2] = {-1, -1};
  long most_growth_kib = 0;
  // The kills fall while the mix runs, at a random moment within the time it takes undisturbed.
  const auto mix_time = undisturbed_mix_time(*server, mix, expected);
  ASSERT_FALSE(HasFailure());

  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const size_t victim = rng() % 2;
    stage_process& killed = stages[victim];
    const stage_process& survivor = stages[1 - victim];
    kill_during_mix(*server, mix, expected, killed, "stage " + killed.layers(), mix_time, rng);
    // The link is back (a request may have finished before the kill and none needed it yet).
    for (int i = 0; i < 500 && health_status(*server) != 200; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_EQ(health_status(*server), 200) << "the engine did not take stage " << killed.layers() << " back";
    expect_nothing_held(*server);
    EXPECT_TRUE(survivor.alive()) << "stage " << survivor.layers() << " was not killed but ended:\n" << survivor.log();
    stage_kib_since_start[victim] = resident_kib(killed.pid());
    if (stage_kib_since_start[1 - victim] < 0) {
      stage_kib_since_start[1 - victim] = resident_kib(survivor.pid());
    } else {
      most_growth_kib = std::max(most_growth_kib, resident_kib(survivor.pid()) - stage_kib_since_start[1 - victim]);
    }
    if (HasFailure()) break;  // one trial's failure, with its log, not twenty
  }
  const std::string log = server->log();
  // The kills met steps in flight, not only an idle engine: the scheduler put requests back.
  static const std::regex put_back(R"(lost a pipeline stage \(.*?\); ([0-9]+) running requests wait)");
  const int num_put_back = sum_of(log, put_back);
  EXPECT_GT(num_put_back, 10) << "the kills hardly met a request in flight:\n" << log;
  EXPECT_GE(count_of(log, "reconnected after"), 10) << log;
  std::printf("pipeline_outputs_e2e: %d running requests put back after 20 kills\n", num_put_back);
  // A stage holds no request's state: its KV pool is the engine's block table's, and what it
  // touches is bounded by the engine's 32 MiB pool (its share of the layers).
  EXPECT_LT(most_growth_kib, 16 * 1024) << "a stage that was not killed grew while the other was";
  std::printf("a stage that was not killed grew at most %ld KiB\n", most_growth_kib);
  if (HasFailure()) ADD_FAILURE() << "server log:\n" << log;
}

// The pair of pipelines loses a stage: kill -9 of one of its four stages (the prefill's or the
// decode's) at a random moment of a mix of 8 requests, restarted on its port after 0-400 ms, six
// trials: every request completes with the undisturbed colocated output (seeded sampling too),
// each trial ends with nothing held (blocks, reservations, KV transfers), and the engine takes
// the restarted stage back. `troupe scale --list` shows both instances' stages.
TEST_F(pipeline_outputs_e2e, a_stage_of_a_pipelined_pair_killed_loses_no_request_and_no_token) {
  const uint64_t seed = failover_seed("pipeline_outputs_e2e_pair");
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));

  const std::vector<mixed_request> mix = kill_mix();
  const std::vector<outcome> expected = colocated_reference(mix);
  ASSERT_FALSE(HasFailure());

  make_pair_credentials();
  std::deque<stage_process> stages;  // the prefill's, then the decode's, each on a port of its own
  stages.emplace_back("0-1", stories_dir, pair_stage_args("stage-p"), free_port());
  stages.emplace_back("0-1", stories_dir, pair_stage_args("stage-d"), free_port());
  topology_spec pair = pipelined_pair(stages[0], stages[1],
                                      "micro_batches = 2\nreconnect_first_delay_ms = 50\nreconnect_max_delay_ms = 200\n"
                                      "failover_wait_ms = 30000\n");
  pair.admin = true;
  controller_process launch(controller_process::kind::launch, pair.write(dir_ / "pair.toml"), dir_ / "pair.log");

  const auto mix_time = undisturbed_mix_time(launch, mix, expected);
  ASSERT_FALSE(HasFailure()) << launch.log();
  // `troupe scale --list` names each instance's stages with their busy shares (from each node's
  // own stages), the prefill's and the decode's.
  const run_result listed =
      run_troupe("scale --controller 127.0.0.1:" + std::to_string(launch.admin_port()) + " --credentials " +
                 shell_quote((dir_.path() / "certs").string()) + " --name admin --list");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  for (const char* role : {"prefill", "decode"}) {
    EXPECT_TRUE(std::regex_search(
        listed.out, std::regex(std::string(" role=") + role + " .* stages=0-1:[0-9]+\\.[0-9]%,2-4:[0-9]+\\.[0-9]%\n")))
        << role << ":\n"
        << listed.out;
  }

  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const size_t victim = rng() % 2;
    stage_process& killed = stages[victim];
    kill_during_mix(launch, mix, expected, killed, victim == 0 ? "the prefill's stage" : "the decode's stage", mix_time,
                    rng);
    expect_nothing_held(launch);
    // Its engine took the restarted stage back (an idle one notices the loss by itself).
    for (int i = 0; i < 500 && killed.log().find("link up") == std::string::npos; ++i)
      std::this_thread::sleep_for(20ms);
    EXPECT_NE(killed.log().find("link up"), std::string::npos) << "the restarted stage was not taken back";
    if (HasFailure()) break;
  }
  // The kills met steps in flight.
  const std::string log = launch.log();
  // The reason in the parentheses may hold parentheses itself (a curve:// endpoint's key can).
  static const std::regex put_back(R"(lost a pipeline stage \(.*?\); ([0-9]+) running requests wait)");
  const int num_put_back = sum_of(log, put_back);
  EXPECT_GT(num_put_back, 0) << "the kills never met a request in flight";
  static const std::regex prefill_put_back(R"(prefill-a \| .*lost a pipeline stage \(.*?\); ([0-9]+) running)");
  std::printf("pipelined pair: %d running requests put back after 6 kills, %d of them by the prefill\n", num_put_back,
              sum_of(log, prefill_put_back));
  if (HasFailure()) ADD_FAILURE() << "launch log:\n" << log;
}

}  // namespace
}  // namespace troupe::test::cluster
