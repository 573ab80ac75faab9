// Pipeline stages (issue 27): a model cut into two stages, the first served by a stage server
// over loopback TCP (its own thread and compute threads, as its own machine's cores would be),
// the second driven here, against the whole model in one place, side by side in one run:
//   - batch-1 decode: time per token;
//   - 32 streams decoding: tokens/s and each stage's busy share with 1, 2 and 4 micro-batches
//     (the bubble is the share of the step a stage waits);
//   - the residual stream's transfer: what a step through the pipeline costs beyond its two
//     stages' compute, against a plain TCP copy of the same bytes both ways.
//
//   troupe_bench_pipeline --model MODEL.gguf [--threads 1] [--streams 32] [--steps 16] [--split N] [--reps 3]

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/blas_core.hpp"
#include "bench/bench_support.hpp"
#include "bench/timed_model.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "kvtransfer/kv_tcp.hpp"
#include "model/loader/model_loader.hpp"
#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_server.hpp"

namespace troupe {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point begin) {
  return std::chrono::duration<double>(clock_type::now() - begin).count();
}

using bench::timed_model;  // the last stage, timed for its busy share

constexpr int block_size = 16;

// One step of `num_seqs` sequences, each `count` tokens from position `first`, sequence s in
// blocks s * blocks_per_seq onwards; logits for each sequence's last token. Token ids stay in
// the smallest vocabulary a test model has (stories260K: 512).
forward_batch step_batch(int num_seqs, int first, int count, int blocks_per_seq) {
  forward_batch batch;
  batch.query_start.push_back(0);
  batch.block_table_start.push_back(0);
  for (int s = 0; s < num_seqs; ++s) {
    for (int t = first; t < first + count; ++t) {
      batch.token_ids.push_back(5 + (t * 31 + s * 7) % 499);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back((int64_t{s} * blocks_per_seq + t / block_size) * block_size + t % block_size);
    }
    batch.query_start.push_back(batch.num_tokens());
    batch.context_lengths.push_back(first + count);
    for (int b = 0; b < blocks_per_seq; ++b) batch.block_tables.push_back(s * blocks_per_seq + b);
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
    batch.logits_rows.push_back(batch.num_tokens() - 1);
  }
  return batch;
}

// Prefill of `prompt` tokens then `steps` decode steps of `num_seqs` sequences; seconds of the
// decode steps.
double decode_seconds(model& m, int num_seqs, int prompt, int steps, int blocks_per_seq) {
  std::vector<float> logits(static_cast<size_t>(num_seqs) * m.config().vocab_size);
  m.forward(step_batch(num_seqs, 0, prompt, blocks_per_seq), logits.data());
  const auto begin = clock_type::now();
  for (int i = 0; i < steps; ++i) m.forward(step_batch(num_seqs, prompt + i, 1, blocks_per_seq), logits.data());
  return seconds_since(begin);
}

// Seconds to send `bytes` over loopback TCP and back, as the pipeline's transfers do per step.
double plain_tcp_round_trip(size_t bytes, int reps) {
  std::string endpoint;
  const int listener = kv_tcp_listen("127.0.0.1", endpoint);
  std::string why;
  const int client = kv_tcp_connect(endpoint, std::chrono::seconds(5), std::chrono::seconds(5), why);
  int server = -1;
  for (int i = 0; i < 500 && server < 0; ++i) {
    server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (server < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (client < 0 || server < 0) throw std::runtime_error("plain tcp copy: " + why);
  kv_tcp_prepare_accepted(server, std::chrono::seconds(5));
  kv_tcp_prepare_accepted(client, std::chrono::seconds(5));
  std::vector<std::byte> out(bytes), in(bytes);
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  std::thread echo([&] {
    std::vector<std::byte> buffer(bytes);
    std::string e;
    for (int r = 0; r < reps; ++r) {
      if (!kv_tcp_read_exact(server, buffer, deadline, e)) return;
      kv_tcp_write_frame(server, {}, buffer, deadline, e);
    }
  });
  const auto begin = clock_type::now();
  for (int r = 0; r < reps; ++r) {
    kv_tcp_write_frame(client, {}, out, deadline, why);
    kv_tcp_read_exact(client, in, deadline, why);
  }
  const double seconds = seconds_since(begin) / reps;
  echo.join();
  ::close(client);
  ::close(server);
  ::close(listener);
  return seconds;
}

int run(int argc, char** argv) {
  std::string path;
  int threads = 1, streams = 32, steps = 16, split = 0, prompt = 32, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--model")
      path = value;
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--streams")
      streams = std::stoi(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--split")
      split = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  if (path.empty()) throw std::runtime_error("--model MODEL is required");
  const loaded_model whole = load_model(load_options{path});
  const model_config& c = whole.config;
  if (split <= 0) split = c.num_layers / 2;
  const layer_range front{0, split}, back{split, c.num_layers};
  const int blocks_per_seq = (prompt + steps + block_size) / block_size + 1;
  const int num_blocks = blocks_per_seq * streams;
  load_options front_options{path};
  front_options.layers = front;
  load_options back_options{path};
  back_options.layers = back;
  const loaded_model front_weights = load_model(front_options);
  const loaded_model back_weights = load_model(back_options);

  auto colocated = make_cpu_model(c, whole.weights, {num_blocks, block_size}, threads, dtype::f16);
  auto front_model = make_cpu_model(c, front_weights.weights, {num_blocks, block_size}, threads, dtype::f16, front);
  stage_server server(*front_model, front, {});
  std::printf(
      "model %s: %d layers, hidden %d; stages: layers %s on a stage server, %s here; %d threads each; "
      "load average %.2f\n",
      path.c_str(), c.num_layers, c.hidden_size, layer_range_text(front).c_str(), layer_range_text(back).c_str(),
      threads, bench::load_average());

  auto pipelined_with = [&](int micro_batches, timed_model** timed) {
    auto timed_back = std::make_unique<timed_model>(
        make_cpu_model(c, back_weights.weights, {num_blocks, block_size}, threads, dtype::f16, back));
    *timed = timed_back.get();
    pipeline_settings settings;
    settings.micro_batches = micro_batches;
    return make_pipelined_model(std::move(timed_back), back, {{server.endpoint(), front}}, settings);
  };

  // Batch-1 decode latency, the two alternating, best of `reps` each (a shared machine's noise).
  {
    double whole_s = 1e30, piped_s = 1e30;
    timed_model* timed = nullptr;
    auto pipelined = pipelined_with(1, &timed);
    for (int r = 0; r < reps; ++r) {
      whole_s = std::min(whole_s, decode_seconds(*colocated, 1, prompt, steps, blocks_per_seq));
      piped_s = std::min(piped_s, decode_seconds(*pipelined, 1, prompt, steps, blocks_per_seq));
    }
    std::printf("batch 1 decode: colocated %.2f ms/token, 2 stages %.2f ms/token (%.2fx the colocated throughput)\n",
                1e3 * whole_s / steps, 1e3 * piped_s / steps, whole_s / piped_s);
  }
  // Streams with 1, 2 and 4 micro-batches: tokens/s and each stage's busy share.
  double whole_s = 1e30;
  for (int r = 0; r < reps; ++r)
    whole_s = std::min(whole_s, decode_seconds(*colocated, streams, prompt, steps, blocks_per_seq));
  // The same cores in one place: the whole model with both stages' threads.
  double whole_both_s = 1e30;
  {
    auto both = make_cpu_model(c, whole.weights, {num_blocks, block_size}, 2 * threads, dtype::f16);
    for (int r = 0; r < reps; ++r) {
      whole_both_s = std::min(whole_both_s, decode_seconds(*both, streams, prompt, steps, blocks_per_seq));
    }
  }
  std::printf("%d streams decoding: colocated %.1f tok/s on %d threads, %.1f tok/s on %d\n", streams,
              streams * steps / whole_s, threads, streams * steps / whole_both_s, 2 * threads);
  std::printf("%14s %10s %9s %12s %12s %8s\n", "micro-batches", "tok/s", "x coloc", "stage 1 busy", "stage 2 busy",
              "bubble");
  for (int micro : {1, 2, 4}) {
    timed_model* timed = nullptr;
    auto pipelined = pipelined_with(micro, &timed);
    std::vector<float> logits(static_cast<size_t>(streams) * c.vocab_size);
    pipelined->forward(step_batch(streams, 0, prompt, blocks_per_seq), logits.data());
    const uint64_t busy_before = server.busy_ns();
    timed->reset();
    const auto begin = clock_type::now();
    for (int i = 0; i < steps; ++i)
      pipelined->forward(step_batch(streams, prompt + i, 1, blocks_per_seq), logits.data());
    const double wall = seconds_since(begin);
    const double front_busy = (server.busy_ns() - busy_before) / 1e9 / wall;
    const double back_busy = timed->busy_seconds() / wall;
    std::printf("%14d %10.1f %9.2f %11.0f%% %11.0f%% %7.0f%%\n", micro, streams * steps / wall, whole_s / wall,
                100 * front_busy, 100 * back_busy, 100 * (1 - (front_busy + back_busy) / 2));
  }
  // The transfer's cost: a 1-micro-batch step beyond its stages' compute, against a plain copy.
  {
    timed_model* timed = nullptr;
    auto pipelined = pipelined_with(1, &timed);
    std::vector<float> logits(static_cast<size_t>(streams) * c.vocab_size);
    const int tokens = 256;  // a prefill chunk: the residual is tokens * hidden floats
    const int seqs = 1;
    std::vector<float> one(c.vocab_size);
    const uint64_t busy_before = server.busy_ns();
    timed->reset();
    const auto begin = clock_type::now();
    pipelined->forward(step_batch(seqs, 0, tokens, tokens / block_size + 1), one.data());
    const double wall = seconds_since(begin);
    const double compute = (server.busy_ns() - busy_before) / 1e9 + timed->busy_seconds();
    const size_t bytes = static_cast<size_t>(tokens) * c.hidden_size * sizeof(float);
    const double plain = plain_tcp_round_trip(bytes, 20);
    std::printf(
        "residual of %d tokens (%.2f MB each way): pipeline step beyond compute %.2f ms; plain TCP there and "
        "back %.2f ms\n",
        tokens, bytes / 1e6, 1e3 * (wall - compute), 1e3 * plain);
  }
  return 0;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  try {
    return troupe::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_bench_pipeline: %s\n", e.what());
    return 1;
  }
}
