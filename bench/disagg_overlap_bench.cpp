// How much of a prefill's KV transfer the layer-by-layer stream hides behind the prefill's own
// compute, and how long after the prefill's last layer the decode side has the whole KV.
//
// Two CPU instances of one model in this process (the prefill side P and the decode side D),
// the KV plane between them forced through its ZeroMQ socket on loopback (no direct path). P runs
// one prompt (whole, or in chunks) through the real model_runner with its KV streamed out
// (kvtransfer/kv_layer_streamer.hpp); D's receiver imports it. Each measurement runs twice:
//   overlapped: D's readiness is known before P computes, so each layer leaves as soon as it is
//               written while the next layers compute (how serving runs);
//   after:      readiness comes only once P's forward is done, so every frame is sent back to
//               back after the compute: the transfer's whole time, hidden by nothing.
// hidden share = 1 - (overlapped: KV complete - forward end) / (after: KV complete - readiness).
// Then one decode step on D from the imported KV (its time is the yardstick for the gap), and
// the token it samples is checked against P continuing itself.
//
// With --stage-layers N the prefill side is a 2-stage pipeline (issue 27): layers 0 .. N-1 on a
// stage server in this process over loopback TCP (its KV fetched over the stage link as the KV
// plane sends it), the rest driven by the pipelined model.
//
// Usage: troupe_bench_disagg_overlap --model DIR [--prompt 2048] [--chunk 0] [--reps 3] [--threads 2]
//                                    [--stage-layers N]

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "bench/bench_support.hpp"
#include "engine/model_runner.hpp"
#include "engine/served_model.hpp"
#include "kvtransfer/kv_receiver.hpp"
#include "kvtransfer/kv_layer_streamer.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_server.hpp"

namespace {

using namespace troupe;
using clock_type = std::chrono::steady_clock;

double ms(clock_type::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct completion {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t done_transfer = 0;
  clock_type::time_point at;
  std::string failure;

  void reset() {
    std::lock_guard lock(mutex);
    done_transfer = 0;
    failure.clear();
  }
  bool wait(uint64_t transfer, std::chrono::seconds timeout) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return done_transfer == transfer || !failure.empty(); }) &&
           failure.empty();
  }
};

// The plans of one prompt of `prompt` tokens in chunks of `chunk` (0: whole).
std::vector<step_plan> prefill_plans(int64_t id, const std::vector<int32_t>& prompt, int chunk, int block_size,
                                     uint64_t transfer_id, uint64_t& step_id) {
  std::vector<step_plan> plans;
  const int n = static_cast<int>(prompt.size());
  if (chunk <= 0) chunk = n;
  for (int begin = 0; begin < n; begin += chunk) {
    const int end = std::min(n, begin + chunk);
    step_plan plan;
    plan.step_id = step_id++;
    scheduled_sequence s;
    s.request_id = id;
    s.num_computed_tokens = begin;
    s.new_token_ids.assign(prompt.begin() + begin, prompt.begin() + end);
    const int first_block = begin == 0 ? 0 : (begin + block_size - 1) / block_size;
    const int end_block = (end + block_size - 1) / block_size;
    s.block_table_start = first_block;
    for (int b = first_block; b < end_block; ++b) s.block_table.push_back(b);
    s.sample = end == n;
    if (begin == 0) {
      sampling_params greedy;
      greedy.temperature = 0.0f;
      greedy.max_tokens = 16;
      s.params = greedy;
      s.kv_send_transfer_id = transfer_id;
    }
    plan.sequences.push_back(std::move(s));
    plans.push_back(std::move(plan));
  }
  return plans;
}

// One decode step of request `id` with `token` after `context` cached tokens: an entry that
// starts the request on the runner (its whole block table and parameters).
step_plan decode_plan(int64_t id, int32_t token, int context, int block_size, uint64_t step_id) {
  step_plan plan;
  plan.step_id = step_id;
  scheduled_sequence s;
  s.request_id = id;
  s.num_computed_tokens = context;
  s.new_token_ids = {token};
  const int blocks = (context + 1 + block_size - 1) / block_size;
  s.block_table_start = 0;
  for (int b = 0; b < blocks; ++b) s.block_table.push_back(b);
  s.sample = true;
  s.output_index = 1;
  sampling_params greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 16;
  s.params = greedy;
  plan.sequences.push_back(std::move(s));
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  CLI::App app{"KV transfer overlap: how much of it the layer-wise stream hides behind prefill compute"};
  std::string model_path;
  int prompt_len = 2048;
  int chunk = 0;
  int reps = 3;
  int threads = 2;
  app.add_option("--model", model_path, "model directory (e.g. the 12-layer dummy of docs/benchmarks.md)")->required();
  app.add_option("--prompt", prompt_len, "prompt tokens")->capture_default_str();
  app.add_option("--chunk", chunk, "prefill chunk (max_num_batched_tokens); 0: whole prompt")->capture_default_str();
  app.add_option("--reps", reps, "repeats (median reported)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads per model")->capture_default_str();
  int stage_layers = 0;
  app.add_option("--stage-layers", stage_layers,
                 "the prefill side as a 2-stage pipeline: layers 0..N-1 on a stage server over loopback TCP; 0: one "
                 "model")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  model_spec spec;
  spec.path = model_path;
  spec.device = device_request::cpu;
  spec.backend.threads = threads;
  spec.block_size = 16;
  spec.num_kv_blocks = prompt_len / 16 + 8;
  spec.max_model_len = prompt_len + 64;
  auto decode_side = load_served_model(spec);
  const layer_range front{0, stage_layers}, back{stage_layers, 0};
  if (stage_layers > 0) spec.backend.layers = back;
  auto prefill_side = load_served_model(spec);
  // The pipeline's first stage: its own weights and pool, served over loopback TCP.
  std::unique_ptr<loaded_model> front_weights;
  std::unique_ptr<model> front_model;
  std::unique_ptr<stage_server> front_server;
  if (stage_layers > 0) {
    load_options options{model_path};
    options.show_progress = false;
    options.layers = front;
    front_weights = std::make_unique<loaded_model>(load_model(options));
    front_model = make_cpu_model(front_weights->config, front_weights->weights, prefill_side->backend_model->kv_shape(),
                                 threads, prefill_side->backend_model->kv_dtype(), front);
    front_server = std::make_unique<stage_server>(*front_model, front, stage_server_settings{});
    prefill_side->backend_model = make_pipelined_model(std::move(prefill_side->backend_model), back,
                                                       {{front_server->endpoint(), front}}, pipeline_settings{});
  }
  const int vocab = prefill_side->backend_model->config().vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(3 + (i * 7919) % (vocab - 3));

  completion done;
  kv_channel_settings channel;
  channel.allow_direct = false;  // through the socket, as between processes
  kv_receiver receiver(*decode_side->backend_model, channel,
                       kv_receiver_events{[&](uint64_t transfer, int64_t) {
                                            std::lock_guard lock(done.mutex);
                                            done.done_transfer = transfer;
                                            done.at = clock_type::now();
                                            done.changed.notify_all();
                                          },
                                          [&](uint64_t, int64_t, const std::string& why) {
                                            std::lock_guard lock(done.mutex);
                                            done.failure = why;
                                            done.changed.notify_all();
                                          }});
  kv_sender sender(channel, kv_sender_events{[&](uint64_t, const std::string& why) {
                     std::lock_guard lock(done.mutex);
                     done.failure = "sender: " + why;
                     done.changed.notify_all();
                   }});
  model_runner prefill_runner(*prefill_side->backend_model, 1, false);
  prefill_runner.stream_kv_to(
      std::make_unique<kv_layer_streamer>(*prefill_side->backend_model, sender, std::chrono::minutes(2)));
  model_runner decode_runner(*decode_side->backend_model, 1, false);

  const int block_size = 16;
  const int num_blocks = (prompt_len + block_size - 1) / block_size;
  std::vector<int32_t> decode_blocks;
  for (int b = 0; b < num_blocks; ++b) decode_blocks.push_back(b);
  const size_t kv_bytes = static_cast<size_t>(prompt_len) * prefill_side->backend_model->config().num_layers * 2 *
                          prefill_side->backend_model->config().num_kv_heads *
                          prefill_side->backend_model->config().head_dim * 4;
  std::printf("model %s: %d layers, prompt %d tokens, %s, KV %.1f MiB (f32), %d threads per side, load average %.2f\n",
              model_path.c_str(), prefill_side->backend_model->config().num_layers, prompt_len,
              chunk > 0 ? ("chunks of " + std::to_string(chunk)).c_str() : "one chunk", kv_bytes / 1048576.0, threads,
              troupe::bench::load_average());
  if (stage_layers > 0) std::printf("prefill side: %s\n", prefill_side->backend_model->backend_name().c_str());

  uint64_t step_id = 0;
  uint64_t transfer = 1000;
  int64_t request = 1;
  std::vector<double> computes, exposed, alone, decode_steps;
  int32_t first_token = -1;
  bool tokens_agree = true;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    for (bool overlapped : {true, false}) {
      ++transfer;
      ++request;
      done.reset();
      kv_expectation expectation;
      expectation.transfer_id = transfer;
      expectation.request_id = request;
      expectation.block_ids = decode_blocks;
      expectation.num_tokens = prompt_len;
      expectation.deadline = clock_type::now() + std::chrono::minutes(2);
      receiver.expect(std::move(expectation));
      if (overlapped) sender.ready(transfer, receiver.endpoint(), "");
      const auto start = clock_type::now();
      step_result last;
      for (const step_plan& plan : prefill_plans(request, prompt, chunk, block_size, transfer, step_id)) {
        last = prefill_runner.run(plan);
      }
      const auto forward_end = clock_type::now();
      if (!overlapped) sender.ready(transfer, receiver.endpoint(), "");
      if (!done.wait(transfer, std::chrono::seconds(120))) {
        std::fprintf(stderr, "transfer %llu did not complete: %s\n", static_cast<unsigned long long>(transfer),
                     done.failure.c_str());
        return 1;
      }
      // Ends the request on the prefill runner (its stream is finished already).
      step_plan drop;
      drop.step_id = step_id++;
      drop.finished_ids = {request};
      prefill_runner.run(drop);
      if (rep == 0) {
        first_token = last.tokens.at(0).token_id;
        continue;
      }
      if (overlapped) {
        computes.push_back(ms(forward_end - start));
        exposed.push_back(ms(done.at - forward_end));  // negative: complete before the forward ended
        // One decode step on D from the imported KV; P continues itself for the check.
        const auto decode_start = clock_type::now();
        const step_result d = decode_runner.run(decode_plan(request, first_token, prompt_len, block_size, step_id++));
        decode_steps.push_back(ms(clock_type::now() - decode_start));
        step_plan end_d;
        end_d.step_id = step_id++;
        end_d.finished_ids = {request};
        decode_runner.run(end_d);
        tokens_agree = tokens_agree && last.tokens.at(0).token_id == first_token && !d.tokens.empty();
        if (rep == 1) {
          // The decode side's token equals the prefill side's own continuation.
          auto own = prefill_plans(request + 100000, prompt, 0, block_size, 0, step_id);
          own[0].sequences[0].kv_send_transfer_id = 0;
          prefill_runner.run(own[0]);
          const step_result p =
              prefill_runner.run(decode_plan(request + 100000, first_token, prompt_len, block_size, step_id++));
          step_plan end_p;
          end_p.step_id = step_id++;
          end_p.finished_ids = {request + 100000};
          prefill_runner.run(end_p);
          if (p.tokens.at(0).token_id != d.tokens.at(0).token_id) {
            std::fprintf(stderr, "the decode side sampled %d, the prefill side itself %d\n", d.tokens.at(0).token_id,
                         p.tokens.at(0).token_id);
            tokens_agree = false;
          }
        }
      } else {
        alone.push_back(ms(done.at - forward_end));
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double landed_ms = median(exposed);
  const double exposed_ms = std::max(0.0, landed_ms);
  const double alone_ms = median(alone);
  std::printf("prefill compute (P's forward)                 %9.1f ms\n", median(computes));
  std::printf("transfer alone (sent after the compute)       %9.1f ms  (%.2f GiB/s)\n", alone_ms,
              kv_bytes / 1073741824.0 / (alone_ms / 1000.0));
  std::printf("transfer left after the forward (overlapped)  %9.1f ms\n", exposed_ms);
  std::printf("share of the transfer hidden behind compute   %9.1f %%\n", 100.0 * (1.0 - exposed_ms / alone_ms));
  std::printf(
      "KV complete on D, after P's forward ended      %9.1f ms (negative: before; P's last layer's attention,\n"
      "                                                          MLP, final norm and lm_head run after its KV left)\n",
      landed_ms);
  std::printf("one decode step on D (context %d)           %9.1f ms\n", prompt_len, median(decode_steps));
  std::printf("decode side continues like the prefill side:  %s\n", tokens_agree ? "yes" : "NO");
  return tokens_agree ? 0 : 1;
}
