// Aggregate tokens/s of a running `troupe serve` with N concurrent streams, the way clients use
// it: one ZeroMQ client per stream, each sending one greedy request of --prompt token ids
// (different for every stream, so nothing is shared through the prefix cache) for exactly
// --decode tokens (ignore_eos). All streams start together; the figure is N·decode over the
// time until the last one finished, prompts included. bench/llama_cpp_parallel_bench.mjs
// measures llama.cpp the same way; bench/serve_vs_llama_cpp.sh runs both.
//
//   troupe_bench_serve --endpoint tcp://127.0.0.1:5557 [--streams 1,8,32] [--prompt 32]
//                      [--decode 128] [--reps 3] [--vocab 32000] [--plugins NAME,...]
//
// --plugins: every request names these logits plugins (the server must have loaded them), for
// the plugin overhead run (bench/plugin_overhead.sh).

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_support.hpp"
#include "client/client.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using troupe::bench::load_average;
using troupe::bench::parse_list;

struct stream_result {
  int num_tokens = 0;
  double ttft = 0;
  std::string error;
};

// One round: `num_streams` requests at once; returns the seconds until the last one finished.
double run_round(const std::string& endpoint, int num_streams, int prompt_len, int decode, int vocab, int round,
                 const std::vector<std::string>& plugins, std::vector<stream_result>& results) {
  results.assign(num_streams, {});
  std::barrier start(num_streams + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < num_streams; ++s) {
    threads.emplace_back([&, s] {
      start.arrive_and_wait();  // before anything that can throw: a missing arrival would hang the round
      try {
        troupe::client c(endpoint);
        c.set_timeout(std::chrono::minutes(5));
        troupe::generate_request r;
        std::vector<int32_t> ids;
        for (int i = 0; i < prompt_len; ++i) ids.push_back(5 + (round * 131 + s * 37 + i * 11) % (vocab - 10));
        r.prompt_token_ids = ids;
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = decode;
        r.sampling.ignore_eos = true;
        r.sampling.logits_plugins = plugins;
        const auto sent = clock_type::now();
        bool first = true;
        auto out = c.generate(r, [&](const troupe::delta_reply& d) {
          if (first && !d.token_ids.empty()) {
            results[s].ttft = std::chrono::duration<double>(clock_type::now() - sent).count();
            first = false;
          }
        });
        results[s].num_tokens = static_cast<int>(out.token_ids.size());
      } catch (const std::exception& e) {
        results[s].error = e.what();
      }
    });
  }
  start.arrive_and_wait();
  const auto begin = clock_type::now();
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(clock_type::now() - begin).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string endpoint;
  std::vector<int> stream_counts = {1, 8, 32};
  int prompt_len = 32, decode = 128, reps = 3, vocab = 32000;
  std::vector<std::string> plugins;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--endpoint")
      endpoint = value;
    else if (flag == "--streams")
      stream_counts = parse_list(value);
    else if (flag == "--prompt")
      prompt_len = std::stoi(value);
    else if (flag == "--decode")
      decode = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--vocab")
      vocab = std::stoi(value);
    else if (flag == "--plugins") {
      std::stringstream names(value);
      for (std::string name; std::getline(names, name, ',');) plugins.push_back(name);
    } else
      throw std::runtime_error("unknown flag " + flag +
                               " (expected --endpoint, --streams, --prompt, --decode, --reps, --vocab, --plugins)");
  }
  if (endpoint.empty()) throw std::runtime_error("--endpoint tcp://HOST:PORT of a running troupe serve is required");
  if (prompt_len < 1 || decode < 1 || reps < 1 || vocab < 16)
    throw std::runtime_error("--prompt, --decode, --reps >= 1; --vocab >= 16");

  std::printf("troupe: prompt %d, decode %d tokens per stream, best of %d, load average %.2f\n", prompt_len, decode,
              reps, load_average());
  int round = 0;
  for (int num_streams : stream_counts) {
    double best = 0, best_ttft = 0;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      std::vector<stream_result> results;
      const double seconds = run_round(endpoint, num_streams, prompt_len, decode, vocab, round++, plugins, results);
      int total = 0;
      for (const auto& r : results) {
        if (!r.error.empty()) throw std::runtime_error("a stream failed: " + r.error);
        if (r.num_tokens != decode) {
          throw std::runtime_error("a stream got " + std::to_string(r.num_tokens) + " tokens, expected " +
                                   std::to_string(decode));
        }
        total += r.num_tokens;
      }
      double ttft = 0;
      for (const auto& r : results) ttft = std::max(ttft, r.ttft);
      const double tps = total / seconds;
      std::printf("  streams %2d rep %d: %.1f tok/s (%.2f s, slowest first token %.3f s)\n", num_streams, rep, tps,
                  seconds, ttft);
      std::fflush(stdout);
      if (rep > 0 && tps > best) {
        best = tps;
        best_ttft = ttft;
      }
    }
    std::printf("best: streams %d: %.1f tok/s (slowest first token %.3f s)\n", num_streams, best, best_ttft);
    std::fflush(stdout);
  }
  std::printf("load average %.2f after the runs\n", load_average());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_serve: %s\n", e.what());
  return 1;
}
