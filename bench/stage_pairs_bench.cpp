// A prefill/decode pair of 2-stage pipelines handing one prompt's KV over (issue 27): with every
// layer through the two engines, against a KV channel per pair of stages.
//
// Four CPU models of one model in this process: the prefill's stage server (layers 0 .. N-1) and
// engine (the rest), the decode's the same, every link and KV socket on loopback TCP (no direct
// path inside the process). Each side has a KV connector (kvtransfer/kv_connector.hpp); the
// prefill's runs the prompt through its pipelined model with the layer sink of its connector, as
// a prefill worker does. Each repetition runs both ways, alternating which goes first:
//   engines: kv_stage_pairs off: the prefill's stage layers are fetched over its stage link, sent
//            to the decode engine's receiver and written into the decode's stage over its link;
//   pairs:   the prefill's stage pushes its layers straight to the decode's stage, which tells
//            its engine with one frame; only the engines' own layers go engine to engine.
// Reported (medians): the prefill's forward, and when the decode side had the whole KV after the
// forward ended (negative: before). The decode's next-token logits are checked equal both ways.
//
// Usage: troupe_bench_stage_pairs --model DIR [--prompt 1984] [--stage-layers N] [--reps 5]
//                                 [--threads 1]

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "bench/bench_support.hpp"
#include "engine/step_plan.hpp"
#include "kvtransfer/kv_connector.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/model_loader.hpp"
#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_server.hpp"

namespace {

using namespace troupe;
using clock_type = std::chrono::steady_clock;

double ms(clock_type::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// One instance: a stage server for layers [0, cut) and the engine's own layers after it.
struct pipelined_instance {
  pipelined_instance(const std::string& path, int cut, kv_cache_shape kv, int threads) {
    for (const layer_range layers : {layer_range{0, cut}, layer_range{cut, 0}}) {
      load_options options{path};
      options.show_progress = false;
      options.layers = layers;
      weights.push_back(std::make_unique<loaded_model>(load_model(options)));
    }
    front = make_cpu_model(weights[0]->config, weights[0]->weights, kv, threads, dtype::f32, {0, cut});
    server = std::make_unique<stage_server>(*front, layer_range{0, cut}, stage_server_settings{});
    whole = std::shared_ptr<model>(
        make_pipelined_model(make_cpu_model(weights[1]->config, weights[1]->weights, kv, threads, dtype::f32, {cut, 0}),
                             {cut, 0}, {{server->endpoint(), {0, cut}}}, pipeline_settings{}));
  }
  std::vector<std::unique_ptr<loaded_model>> weights;  // outlive the models that view them
  std::unique_ptr<model> front;
  std::unique_ptr<stage_server> server;
  std::shared_ptr<model> whole;
};

// The decode side's completions, by transfer.
struct arrivals {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, clock_type::time_point> done;
  std::string failure;
  kv_receiver_events events() {
    return {[this](uint64_t transfer, int64_t) {
              std::lock_guard lock(mutex);
              done[transfer] = clock_type::now();
              changed.notify_all();
            },
            [this](uint64_t, int64_t, const std::string& why) {
              std::lock_guard lock(mutex);
              failure = why;
              changed.notify_all();
            }};
  }
  bool wait(uint64_t transfer, clock_type::time_point& at) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, std::chrono::minutes(2), [&] { return done.count(transfer) || !failure.empty(); });
    if (!done.count(transfer)) return false;
    at = done[transfer];
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  CLI::App app{"A pair of pipelines: the stages' KV through the engines against a channel per pair of stages"};
  std::string model_path;
  int prompt_len = 1984;
  int stage_layers = 0;
  int reps = 5;
  int threads = 1;
  app.add_option("--model", model_path, "model directory (e.g. the 12-layer model of docs/benchmarks.md)")->required();
  app.add_option("--prompt", prompt_len, "prompt tokens")->capture_default_str();
  app.add_option("--stage-layers", stage_layers, "layers on each side's stage server (0: half)")->capture_default_str();
  app.add_option("--reps", reps, "repetitions of both ways (medians reported)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads per model")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  constexpr int block_size = 16;
  const int num_blocks = (prompt_len + 1 + block_size - 1) / block_size;
  const kv_cache_shape kv{num_blocks + 4, block_size};
  const model_config config = load_hf_config(model_path);  // an HF model directory
  if (stage_layers <= 0) stage_layers = config.num_layers / 2;
  pipelined_instance prefill(model_path, stage_layers, kv, threads), decode(model_path, stage_layers, kv, threads);
  std::vector<int32_t> blocks;
  for (int b = 0; b < num_blocks; ++b) blocks.push_back(b);
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(3 + (i * 7919) % (config.vocab_size - 3));

  arrivals arrived;
  struct way {
    const char* name;
    std::shared_ptr<kv_connector> decode_side, prefill_side;
    std::unique_ptr<kv_layer_sink> sink;
    std::vector<double> forward_ms, landed_ms;
    std::vector<float> logits;
  };
  std::vector<way> ways;
  for (const bool pairs : {false, true}) {
    kv_connector_settings settings;
    settings.channel.allow_direct = false;  // through the sockets, as between processes
    settings.transfer_timeout = std::chrono::minutes(2);
    settings.stage_pairs = pairs;
    way w{pairs ? "a KV channel per pair of stages" : "every layer through the engines",
          nullptr,
          nullptr,
          nullptr,
          {},
          {},
          {}};
    w.decode_side = std::make_shared<kv_connector>(decode.whole, settings, arrived.events());
    w.prefill_side = std::make_shared<kv_connector>(prefill.whole, settings, kv_receiver_events{});
    w.sink = w.prefill_side->make_layer_sink();
    ways.push_back(std::move(w));
  }
  const size_t kv_bytes =
      static_cast<size_t>(prompt_len) * config.num_layers * 2 * config.num_kv_heads * config.head_dim * sizeof(float);
  std::printf(
      "model %s: %d layers (stages of layers 0-%d), prompt %d tokens, KV %.1f MiB (f32), %d threads per model, "
      "load average %.2f\n",
      model_path.c_str(), config.num_layers, stage_layers - 1, prompt_len, kv_bytes / 1048576.0, threads,
      troupe::bench::load_average());

  uint64_t transfer = 100;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    for (size_t k = 0; k < ways.size(); ++k) {
      way& w = ways[(k + static_cast<size_t>(rep)) % ways.size()];
      const int64_t request = static_cast<int64_t>(++transfer);
      const kv_destination where = w.decode_side->expect(
          kv_reservation{request, transfer, blocks, prompt_len, "prefill"}, std::chrono::minutes(2));
      w.sink->start(request, transfer);
      w.prefill_side->send_to(where);
      step_plan plan;
      scheduled_sequence s;
      s.request_id = request;
      s.new_token_ids = prompt;
      s.block_table = blocks;
      s.sample = true;
      plan.sequences.push_back(s);
      forward_batch batch;
      for (int t = 0; t < prompt_len; ++t) {
        batch.token_ids.push_back(prompt[static_cast<size_t>(t)]);
        batch.positions.push_back(t);
        batch.slot_mapping.push_back(int64_t{blocks[static_cast<size_t>(t / block_size)]} * block_size +
                                     t % block_size);
      }
      batch.query_start = {0, prompt_len};
      batch.context_lengths = {prompt_len};
      batch.block_table_start = {0, num_blocks};
      batch.block_tables = blocks;
      batch.logits_rows = {prompt_len - 1};
      std::vector<float> logits(static_cast<size_t>(config.vocab_size));
      const auto start = clock_type::now();
      if (!w.sink->prepare(plan, {&blocks})) {
        std::fprintf(stderr, "%s: the stream did not start\n", w.name);
        return 1;
      }
      batch.after_layer_kv = [&](int layer) { w.sink->on_layer_written(layer); };
      prefill.whole->forward(batch, logits.data());
      w.sink->finish_step();
      const auto forward_end = clock_type::now();
      clock_type::time_point landed;
      if (!arrived.wait(transfer, landed)) {
        std::fprintf(stderr, "%s: transfer %llu did not complete: %s\n", w.name,
                     static_cast<unsigned long long>(transfer), arrived.failure.c_str());
        return 1;
      }
      w.sink->forget(request, false);
      if (rep == 0) continue;
      w.forward_ms.push_back(ms(forward_end - start));
      w.landed_ms.push_back(ms(landed - forward_end));
      // The decode's next token from the KV it holds.
      forward_batch next;
      next.token_ids = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
      next.positions = {prompt_len};
      next.slot_mapping = {int64_t{blocks[static_cast<size_t>(prompt_len / block_size)]} * block_size +
                           prompt_len % block_size};
      next.query_start = {0, 1};
      next.context_lengths = {prompt_len + 1};
      next.block_table_start = {0, num_blocks};
      next.block_tables = blocks;
      next.logits_rows = {0};
      w.logits.assign(static_cast<size_t>(config.vocab_size), 0.0f);
      decode.whole->forward(next, w.logits.data());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (const way& w : ways) {
    std::printf("%-34s prefill forward %8.1f ms, KV complete on the decode side %+8.1f ms after it\n", w.name,
                median(w.forward_ms), median(w.landed_ms));
  }
  const bool same = ways[0].logits == ways[1].logits;
  std::printf("the decode's next-token logits are the same both ways: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}
